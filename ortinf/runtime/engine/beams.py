"""Beam search on the one engine: each step, one ordinary request per live beam.

A beam's step request is its prompt plus the beam's tokens (PreparedRequest.output_token_ids, so the
rules count them as output: min_tokens, forced EOS), asks for `beam_candidates` best next tokens, and
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

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ortinf.runtime.core.request import FinishReason
from ortinf.runtime.engine.outputs import CompletionOutput, RequestOutput
from ortinf.runtime.sample.beam_search import BeamSearch, Hypothesis

if TYPE_CHECKING:
    from ortinf.runtime.engine.async_engine import AsyncEngine
    from ortinf.runtime.engine.llm_engine import LLMEngine, PreparedRequest


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
        self.step_params = replace(params, n=1, num_beams=1, beam_candidates=self.search.num_candidates, temperature=0.0, top_p=1.0,
                                   top_k=0, min_p=0.0, seed=None, output_kind="final_only")
        self.num_cached_tokens: int | None = None
        self.num_steps = 0

    @property
    def done(self) -> bool:
        return self.search.done

    def step_requests(self) -> list[PreparedRequest]:
        """One request per live beam, in the search's beam order."""
        return [replace(self.prepared, params=self.step_params, output_token_ids=beam.token_ids) for beam in self.search.beams]

    def advance(self, outputs: Sequence[RequestOutput]) -> None:
        """Takes the finished step requests (in step_requests' order) and moves the search on."""
        if self.num_cached_tokens is None:
            self.num_cached_tokens = outputs[0].num_cached_tokens
        self.search.advance([o.beam_candidates or [] for o in outputs])
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


def request_ids(request_id: str, run: BeamRun) -> list[str]:
    """The engine ids of a search's step requests this step."""
    return [f"{request_id}-beam{run.num_steps}.{i}" for i in range(len(run.search.beams))]


async def run_async(engine: AsyncEngine, prepared: PreparedRequest, request_id: str) -> list[RequestOutput]:
    """A beam search through the async engine (the server's): the n best outputs; a failed step
    raises as a sampled request's would, and cancelling aborts the step's requests."""
    run = BeamRun(prepared, engine.engine)
    while not run.done:
        step = run.step_requests()
        finals: list[RequestOutput | None] = [None] * len(step)
        async for index, output in engine.generate_many(step, request_ids(request_id, run)):
            finals[index] = output
        run.advance(finals)  # type: ignore[arg-type]
    return run.outputs(request_id)


async def run_many(engine: AsyncEngine, prepared: Sequence[PreparedRequest], request_id: str) -> AsyncIterator[tuple[int, RequestOutput]]:
    """The server's samples as beam searches: `prepared` holds each prompt's request n times (its
    params.n), as for sampled requests; yields (sample index, output) for a prompt's n best once its
    search ends. The searches run together; closing this early cancels them (aborting their steps)."""
    async def search(start: int) -> tuple[int, list[RequestOutput]]:
        return start, await run_async(engine, prepared[start], f"{request_id}-{start}")

    starts = range(0, len(prepared), prepared[0].params.n) if prepared else range(0)
    tasks = [asyncio.ensure_future(search(start)) for start in starts]
    try:
        for done in asyncio.as_completed(tasks):
            start, outputs = await done
            for rank, output in enumerate(outputs):
                yield start + rank, output
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["BeamRun", "request_ids", "run_async", "run_many"]
