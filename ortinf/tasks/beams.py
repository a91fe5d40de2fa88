"""Beam search on the one engine: each step, one ordinary request per live beam.

A beam's step request is its prompt plus the beam's tokens (PreparedRequest.output_token_ids, so the
rules count them as output: min_tokens, forced EOS), asks for `top_candidates` best next tokens, and
ends after that one step (ortinf/runtime/core/stopping.py). ortinf/runtime/sample/beam_search.py picks the next beams
from them. Nothing is copied between beams: the prefix cache shares every full block of a beam's
history with its parent's, by reference count (a block hit is a reference, not a copy), so a step
computes only each beam's tokens past its last full block (on average half a block) and the block a
beam writes is its own: copy-on-write at the block boundary, by recomputing the partial block instead
of copying it. The same mechanism serves decoders and encoder-decoders (whose cross blocks are found
by their input's digest, so the encoder runs once per search).

Why requests per step rather than beams living inside the scheduler (vLLM V0's forked sequences):
the scheduler, the KV manager and the runner stay as they are (preemption, failure isolation,
chunked prefill, priorities all apply to beams unchanged), and a step's beams batch with every other
request. The cost is the partial block recomputed per beam and step (block_size / 2 tokens on
average, one batched prefill row each) and one request's bookkeeping per beam and step; vLLM V1 made
the same choice. With prefix caching off (--no-enable-prefix-caching) each step recomputes whole beams.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ortinf.runtime.core.request import FinishReason
from ortinf.runtime.engine.outputs import CompletionOutput, RequestOutput
from ortinf.runtime.sample.beam_search import BeamSearch, Hypothesis
from ortinf.tasks.programs import Handed, Program

if TYPE_CHECKING:
    from ortinf.runtime.engine.llm_engine import LLMEngine
    from ortinf.runtime.engine.prepared import PreparedRequest


class BeamRun:
    """One prompt's beam search: the step requests of its live beams, then its n best outputs."""

    def __init__(self, prepared: PreparedRequest, engine: LLMEngine) -> None:
        params = prepared.params
        self.prepared = prepared
        self.tokenizer = engine.tokenizer
        self.eos_ids = () if params.ignore_eos else tuple(engine.manifest.eos_token_ids)
        rules = engine.runner.rules
        self.forced_eos = rules.forced_eos if rules is not None else None
        self.search = BeamSearch(params.num_beams, params.max_tokens, (*self.eos_ids, *params.stop_token_ids),
                                 params.length_penalty, params.early_stopping)
        # greedy: the step's own sampled token is never used, only its candidates
        self.step_params = replace(params, n=1, num_beams=1, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None)
        self.step_options = replace(prepared.options, top_candidates=self.search.num_candidates, output_kind="final_only")
        self.num_cached_tokens: int | None = None
        self.num_steps = 0

    @property
    def done(self) -> bool:
        return self.search.done

    def step_requests(self) -> list[PreparedRequest]:
        """One request per live beam, in the search's beam order."""
        return [replace(self.prepared, params=self.step_params, options=self.step_options, output_token_ids=beam.token_ids)
                for beam in self.search.beams]

    def advance(self, outputs: Sequence[RequestOutput]) -> None:
        """Takes the finished step requests (in step_requests' order) and moves the search on."""
        if self.num_cached_tokens is None:
            self.num_cached_tokens = outputs[0].num_cached_tokens
        self.search.advance([o.candidates or [] for o in outputs])
        self.num_steps += 1

    def outputs(self, request_id: str) -> list[RequestOutput]:
        """The n best hypotheses, each a finished RequestOutput with one completion (index = rank)."""
        params = self.prepared.params
        results = []
        for rank, hypothesis in enumerate(self.search.best(params.n)):
            completion = self._completion(rank, hypothesis)
            results.append(RequestOutput(request_id, self.prepared.text, self.prepared.token_ids, [completion], finished=True,
                                         num_cached_tokens=self.num_cached_tokens or 0, num_output_tokens=len(hypothesis.token_ids)))
        return results

    def _completion(self, rank: int, hypothesis: Hypothesis) -> CompletionOutput:
        params = self.prepared.params
        tokens = list(hypothesis.token_ids)
        last = tokens[-1] if tokens else None
        reason, stop_reason = FinishReason.LENGTH, None
        if hypothesis.stopped:
            reason = FinishReason.STOP
            stop_reason = last if last in params.stop_token_ids and last not in self.eos_ids else None
            if last == self.forced_eos and len(tokens) >= params.max_tokens:  # forced by the length (llm_engine._forced_eos_is_length)
                reason = FinishReason.LENGTH
        visible = tokens[:-1] if hypothesis.stopped and last in self.eos_ids else tokens  # EOS is not text
        text = self.tokenizer.decode(visible, skip_special_tokens=params.skip_special_tokens) if self.tokenizer is not None else ""
        return CompletionOutput(rank, text, tokens, reason.value, stop_reason)


class BeamSearches(Program):
    """Beam searches as one program: `prepared` holds each prompt's request n times (its params.n), as for
    sampled requests; each prompt's search hands out its n best, as (sample index, output), when it ends.
    The searches' steps batch together and with every other request."""

    def __init__(self, prepared: Sequence[PreparedRequest], engine: LLMEngine, request_id: str) -> None:
        n = prepared[0].params.n if prepared else 1
        self.request_id = request_id
        self.runs = {start: BeamRun(prepared[start], engine) for start in range(0, len(prepared), n)}
        self.steps: dict[int, list[RequestOutput | None]] = {}
        self.finals: dict[int, RequestOutput] = {}

    @property
    def complete(self) -> bool:
        return all(run.done for run in self.runs.values())

    def start(self) -> list[tuple[Any, PreparedRequest]]:
        return [request for start in self.runs for request in self._launch(start)]

    def _launch(self, start: int) -> list[tuple[Any, PreparedRequest]]:
        requests = self.runs[start].step_requests()
        self.steps[start] = [None] * len(requests)
        return [((start, b), prepared) for b, prepared in enumerate(requests)]

    def advance(self, key: Any, outcome: RequestOutput | BaseException) -> tuple[Handed, list[tuple[Any, PreparedRequest]]]:
        if isinstance(outcome, BaseException):
            raise outcome
        if not outcome.finished:
            return [], []
        start, b = key
        step = self.steps[start]
        step[b] = outcome
        if any(o is None for o in step):
            return [], []
        run = self.runs[start]
        run.advance(step)  # type: ignore[arg-type]
        if not run.done:
            return [], self._launch(start)
        handed = [(start + rank, output) for rank, output in enumerate(run.outputs(f"{self.request_id}-{start}"))]
        self.finals.update(handed)
        return handed, []


__all__ = ["BeamRun", "BeamSearches"]
