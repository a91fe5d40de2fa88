"""OutputProcessor: per-request text, logprobs and timing; turns engine steps into RequestOutputs."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tokenizers import Tokenizer

from ortinf.core.detokenizer import IncrementalDetokenizer
from ortinf.core.request import Request
from ortinf.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from ortinf.worker.scheduler_output import ModelRunnerOutput, TokenLogprobs


@dataclass(slots=True)
class RequestState:
    """What the processor keeps for one live request."""

    prompt: str | None
    detokenizer: IncrementalDetokenizer | None
    metrics: RequestMetrics
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_detokenized: int = 0
    kind: str = "cumulative"  # SamplingParams.output_kind
    # with kind "delta": what earlier outputs already carried
    sent_tokens: int = 0
    sent_chars: int = 0
    sent_logprobs: int = 0
    beam_candidates: list[tuple[int, float]] | None = None  # a beam search's step request's


class OutputProcessor:
    """Keeps each request's text (its detokenizer), logprobs and times, and frames its outputs."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}

    def add_request(self, request: Request, prompt: str | None) -> None:
        params = request.sampling_params
        detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params) if self.tokenizer else None
        self.states[request.request_id] = RequestState(
            prompt=prompt,
            detokenizer=detokenizer,
            metrics=RequestMetrics(arrival_time=request.arrival_time),
            logprobs=[] if params.logprobs is not None else None,
            prompt_logprobs=[None] * request.num_prompt_tokens if params.prompt_logprobs is not None else None,
            kind=params.output_kind,
            num_detokenized=request.num_output_tokens,  # a beam's tokens so far are not this request's new output
        )

    def record_prompt_logprobs(self, runner_output: ModelRunnerOutput) -> None:
        """Keeps the prompt logprobs of every prompt chunk, sampled or not, by position (the first
        prompt token has none): a chunk recomputed after a preemption overwrites, never appends."""
        for request_id, (first, chunk) in runner_output.prompt_logprobs.items():
            state = self.states.get(request_id)
            if state is not None and state.prompt_logprobs is not None:
                state.prompt_logprobs[first : first + len(chunk)] = chunk

    def detokenizer(self, request_id: str) -> IncrementalDetokenizer | None:
        """The request's detokenizer (ortinf/core/stopping.py feeds it, token by token, while it judges)."""
        return self.states[request_id].detokenizer

    def record_step(self, request: Request, runner_output: ModelRunnerOutput, now: float) -> None:
        """Takes the tokens a step kept for a request (their text is already in its detokenizer):
        their logprobs, cut to the same count, and the first token's time."""
        state = self.states[request.request_id]
        num_new = request.num_output_tokens - state.num_detokenized
        if num_new <= 0:
            return
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = now
        else:
            state.metrics.inter_token_latencies.append(now - state.metrics.last_token_time)
        state.metrics.last_token_time = now
        if request.request_id in runner_output.beam_candidates:
            state.beam_candidates = runner_output.beam_candidates[request.request_id]
        if state.logprobs is not None and request.request_id in runner_output.logprobs:
            state.logprobs += runner_output.logprobs[request.request_id][:num_new]
        state.num_detokenized = request.num_output_tokens

    def make_output(self, request: Request) -> RequestOutput | None:
        """The request's output after this step, as its SamplingParams.output_kind asks: everything so
        far, only what is new (copying O(new), not O(all), per step), or None until it finishes."""
        state = self.states[request.request_id]
        finished = request.is_finished
        if state.kind == "final_only" and not finished:
            return None
        if finished and state.metrics.finished_time is None:
            state.metrics.finished_time = time.monotonic()
        state.metrics.first_scheduled_time = request.first_scheduled_time
        delta = state.kind == "delta"
        if delta:
            visible = state.detokenizer.visible_length(finished) if state.detokenizer else 0
            text = state.detokenizer.text[state.sent_chars:visible] if state.detokenizer else ""
            token_ids = request.output_token_ids[state.sent_tokens:]
            logprobs = state.logprobs[state.sent_logprobs:] if state.logprobs is not None else None
            state.sent_chars, state.sent_tokens = max(visible, state.sent_chars), request.num_output_tokens
            state.sent_logprobs = len(state.logprobs) if state.logprobs is not None else 0
        else:
            text = state.detokenizer.visible_text(finished) if state.detokenizer else ""
            token_ids = list(request.output_token_ids)
            logprobs = list(state.logprobs) if state.logprobs is not None else None
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=token_ids,
            finish_reason=request.finish_reason.value if finished and request.finish_reason else None,
            stop_reason=request.stop_reason,
            logprobs=logprobs,
        )
        return RequestOutput(
            request_id=request.request_id,
            prompt=state.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            prompt_logprobs=state.prompt_logprobs,
            num_cached_tokens=request.num_cached_tokens,
            metrics=state.metrics,
            num_output_tokens=request.num_output_tokens,
            delta=delta,
            beam_candidates=state.beam_candidates,
        )

    def remove(self, request_id: str) -> None:
        self.states.pop(request_id, None)
