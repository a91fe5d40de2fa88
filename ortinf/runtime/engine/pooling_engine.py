"""PoolingEngine: an encoder package's requests (embeddings, classification, a cross-encoder's pair scores)
batched across callers under the scheduler's budget, one graph call per step.

It has LLMEngine's stepping interface (add_request, step, abort, has_unfinished_requests, stats,
num_failed_steps_in_a_row), so the same AsyncEngine thread runs it for the server (its mailboxes,
failure isolation, metrics and shutdown) and the same driver (ortinf/tasks/driver.py) runs its requests as
programs: an HTTP request's inputs are engine requests, and the inputs of every request in flight share
the step's batch. What it does not share with LLMEngine is what an encoder has no use for: no KV
cache, no sampling, no preemption (each request is one forward pass, whole).

A step takes waiting requests in arrival order while the batch fits `max_num_seqs` rows and
`max_num_batched_tokens` padded tokens (rows x the longest row: the most the graph computes); a request
alone over the token budget runs alone. Inside the step the rows run sorted by length, SUB_BATCH at a time:
rows of similar length pad little (all-MiniLM-L6-v2 on 2 cores, benchmarks/encoder_batching.py's texts: 64
rows in arrival order 263 inputs/s, sorted in calls of 16 339, one row at a time 188).

Why not a second scheduler: the choice is that simple because an encoder request cannot be chunked or
preempted, and what the budget bounds, a step's latency and memory, is the same quantity as LLMEngine's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ortinf.errors import RequestError, StepFailedError
from ortinf.runtime.engine.outputs import EngineStats, RequestMetrics, RequestOutput
from ortinf.runtime.worker.encoder_graph import EncoderGraph

log = logging.getLogger(__name__)
SUB_BATCH = 16  # rows per graph call within a step, sorted by length


@dataclass(frozen=True, slots=True)
class PoolingRequest:
    """One encoder input: its token ids (checked), and a text pair's token type ids."""

    token_ids: tuple[int, ...]
    type_ids: tuple[int, ...] | None = None


class PoolingEngine:
    def __init__(self, encoder: EncoderGraph, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048) -> None:
        self.encoder = encoder
        self.manifest = encoder.manifest
        self.tokenizer = encoder.tokenizer
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # request id -> (request, arrival), in arrival order: a client that goes away aborts its inputs one by one, O(1) each
        self.waiting: dict[str, tuple[PoolingRequest, float]] = {}
        self.num_failed_steps_in_a_row = 0
        self.num_steps = 0
        self.num_rows = 0  # inputs run, for the batch-size figure (num_rows / num_steps)

    def prepare(self, token_ids: Sequence[int], type_ids: Sequence[int] | None = None) -> PoolingRequest:
        """A checked request (RequestError: empty, too long, ids off the vocabulary); pure, any thread."""
        self.encoder.check([token_ids])
        if type_ids is not None and len(type_ids) != len(token_ids):
            raise RequestError("token type ids must be as many as the token ids", param="input")
        return PoolingRequest(tuple(token_ids), tuple(type_ids) if type_ids is not None else None)

    def add_request(self, request: PoolingRequest, request_id: str) -> str:
        if not isinstance(request, PoolingRequest):
            raise RequestError("an encoder model takes encoder inputs (embeddings, scores, classification), not prompts", param="model")
        self.waiting[request_id] = (request, time.monotonic())
        return request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting)

    def abort(self, request_id: str) -> RequestOutput | None:
        self.waiting.pop(request_id, None)
        return None

    def stats(self) -> EngineStats:
        return EngineStats(num_running=0, num_waiting=len(self.waiting))

    def _batch(self) -> list[tuple[str, PoolingRequest, float]]:
        batch: list[tuple[str, PoolingRequest, float]] = []
        longest = 0
        while self.waiting and len(batch) < self.max_num_seqs:
            request_id = next(iter(self.waiting))
            request, arrived = self.waiting[request_id]
            longer = max(longest, len(request.token_ids))
            if batch and longer * (len(batch) + 1) > self.max_num_batched_tokens:
                break
            del self.waiting[request_id]
            batch.append((request_id, request, arrived))
            longest = longer
        return batch

    def step(self) -> list[RequestOutput]:
        """Runs one batch of waiting requests; every one of them finishes. A failed graph call fails only
        this batch's requests (each output carries the error) and the engine stays usable."""
        batch = self._batch()
        if not batch:
            return []
        started = time.monotonic()
        has_types = any(r.type_ids is not None for _, r, _ in batch)
        order = sorted(range(len(batch)), key=lambda i: len(batch[i][1].token_ids))
        rows: list[np.ndarray | None] = [None] * len(batch)
        try:
            for start in range(0, len(order), SUB_BATCH):
                part = [batch[i][1] for i in order[start : start + SUB_BATCH]]
                out = self.encoder.run([r.token_ids for r in part], [r.type_ids or (0,) * len(r.token_ids) for r in part] if has_types else None)
                for i, row in zip(order[start : start + SUB_BATCH], np.asarray(out, dtype=np.float32)):
                    rows[i] = row
        except Exception as exc:  # this batch's requests fail; the next step runs the others
            log.exception("an encoder step failed for %d request(s)", len(batch))
            self.num_failed_steps_in_a_row += 1
            error = StepFailedError(f"the encoder failed: {exc}")
            return [self._output(request_id, request, arrived, started, None, error) for request_id, request, arrived in batch]
        self.num_failed_steps_in_a_row = 0
        self.num_steps += 1
        self.num_rows += len(batch)
        return [self._output(request_id, request, arrived, started, row, None)
                for (request_id, request, arrived), row in zip(batch, rows)]

    @staticmethod
    def _output(request_id: str, request: PoolingRequest, arrived: float, started: float, row: np.ndarray | None,
                error: Exception | None) -> RequestOutput:
        now = time.monotonic()
        metrics = RequestMetrics(arrival_time=arrived, first_scheduled_time=started, first_token_time=now, finished_time=now)
        return RequestOutput(request_id, None, list(request.token_ids), [], finished=True, metrics=metrics, error=error, pooled=row)


__all__ = ["PoolingEngine", "PoolingRequest"]
