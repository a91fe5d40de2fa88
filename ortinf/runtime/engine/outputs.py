"""What the engine returns: one RequestOutput per request, with one CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ortinf.runtime.worker.scheduler_output import TokenLogprobs


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
    last_token_time: float | None = None
    # one per step after the first that gave the request tokens, whatever outputs it asked for (a
    # final_only request's too): the inter-token latency histogram's source
    inter_token_latencies: list[float] = field(default_factory=list)


@dataclass(slots=True)
class RequestOutput:
    """A request after a step: everything so far, or with `delta` only what is new since its previous
    output (RequestOptions.output_kind)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = field(default=None, repr=False)
    error: Exception | None = None  # set when an engine step failed this request (it is finished)
    num_output_tokens: int = 0  # tokens generated so far in all, whatever the output kind (metrics read it)
    delta: bool = False
    # a one-step request's best next (token, log-probability) pairs (RequestOptions.top_candidates: ortinf/tasks/beams.py)
    candidates: list[tuple[int, float]] | None = None
    # the watched tokens' log-probabilities at the last sampled position, before any rule (RequestOptions.watch_token_ids)
    watched: dict[int, float] | None = None
    pooled: np.ndarray | None = field(default=None, repr=False)  # an encoder request's output row (ortinf/runtime/engine/pooling_engine.py)

    def followed_by(self, later: RequestOutput) -> RequestOutput:
        """This output and the request's next one as one: the later one itself when it is cumulative,
        the two deltas joined when it is a delta (a mailbox whose reader fell behind keeps one item)."""
        if not later.delta or later.error is not None:
            return later
        a, b = self.outputs[0], later.outputs[0]
        logprobs = None if a.logprobs is None and b.logprobs is None else (a.logprobs or []) + (b.logprobs or [])
        joined = CompletionOutput(b.index, a.text + b.text, a.token_ids + b.token_ids, b.finish_reason, b.stop_reason, logprobs)
        return replace(later, outputs=[joined])


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The engine after a step, as data (vLLM's SchedulerStats): what runs and waits now, and running
    totals since the engine started. Metrics read this, never the scheduler or the KV cache."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    spec_num_drafts: int = 0  # steps in which a request verified proposals
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: tuple[int, ...] = ()
    prefix_disk_restored: int = 0  # --prefix-cache-dir: blocks read from the folder, written to it, evicted from it
    prefix_disk_written: int = 0
    prefix_disk_evicted: int = 0
    prefix_disk_bytes: int = 0  # the folder's block files now, every identity's (as this server knows them)
