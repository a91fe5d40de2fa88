"""What the engine returns: one RequestOutput per request, with one CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field

from ortinf.runtime.scheduler_output import TokenLogprobs


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence: its visible text so far, its tokens and why it ended."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[TokenLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock times (time.monotonic) of a request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass(slots=True)
class RequestOutput:
    """The state of one request after a step (cumulative, not a delta)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = field(default=None, repr=False)
    error: Exception | None = None  # set when an engine step failed this request (it is finished)
