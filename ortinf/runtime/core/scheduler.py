"""Scheduler: continuous batching under a token budget, with chunked prefill and preemption.

There is no prefill or decode phase. Each request has `num_computed_tokens` and catches up to its
`num_tokens` within the step's budget (`max_num_batched_tokens`), running requests first, then
waiting ones in arrival order. When blocks run out, the most recently admitted running request is
preempted: its blocks are freed and it goes back to the front of the queue to be recomputed later,
keeping the tokens it has generated (and often hitting its own blocks in the prefix cache).

Under the priority policy (vLLM's) the queue is kept in (priority, arrival) order, lower first, and
the running request preempted is the least urgent one (the highest (priority, arrival)).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from ortinf.config import SpeculativeConfig
from ortinf.errors import ContextLengthError, RequestError
from ortinf.runtime.core.encoder_cache import EncoderCache
from ortinf.runtime.core.kv_cache_manager import KVCacheManager
from ortinf.runtime.core.request import FinishReason, Request, RequestStatus
from ortinf.runtime.core.stopping import Verdict
from ortinf.runtime.sample.speculative import SpecStats, can_speculate, propose_ngram
from ortinf.runtime.worker.encoder_input import covered
from ortinf.runtime.worker.image_spans import whole_image_chunk
from ortinf.runtime.worker.scheduler_output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits of one step."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    long_prefill_token_threshold: int = 0  # most new tokens of one request per step (0: no cap), vLLM's name
    max_num_encoder_input_tokens: int = 6144  # encoder positions (encoder-decoders) or image tokens run per step, vLLM's name
    speculative: SpeculativeConfig | None = None
    policy: str = "fcfs"  # or "priority"


@dataclass(slots=True)
class SchedulerStats:
    num_preemptions: int = 0
    num_steps: int = 0


def check_fits(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """Raises RequestError for a request that can never run: empty, or longer than the context."""
    if num_prompt_tokens == 0:
        raise RequestError("the prompt is empty: pass at least one token", param="prompt")
    if num_prompt_tokens + max_tokens > max_model_len:
        raise ContextLengthError(
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) is "
            f"{num_prompt_tokens + max_tokens}, beyond the context length {max_model_len}", num_prompt_tokens, max_tokens, max_model_len
        )


class Scheduler:
    """Owns the waiting queue and the running list; talks only to the KV cache manager."""

    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager) -> None:
        self.config = config
        self.kv_cache = kv_cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_ids: set[str] = set()
        self.stats = SchedulerStats()
        self.spec_stats = SpecStats()
        self.drafts: dict[str, list[int]] = {}  # this step's proposals per request id
        self.proposals: dict[str, list[int]] = {}  # a draft model's proposals for the next schedule() (the engine's)
        self.encoder_cache = EncoderCache()  # the image embeddings the runner holds: this scheduler decides them

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def add_request(self, request: Request) -> None:
        """Queues a request; one that can never fit the context length is rejected now."""
        if request.request_id in self.requests:
            raise RequestError(f"request id '{request.request_id}' is already in use")
        check_fits(request.num_prompt_tokens, request.sampling_params.max_tokens or 0, self.config.max_model_len)
        self.requests[request.request_id] = request
        self._enqueue(request, front=False)

    def _enqueue(self, request: Request, front: bool) -> None:
        """Into the waiting queue: at the back (a new request) or the front (a preempted one) in arrival
        order; under the priority policy at its (priority, arrival) place."""
        if self.config.policy == "priority":
            key = _urgency(request)
            index = next((i for i, other in enumerate(self.waiting) if _urgency(other) > key), len(self.waiting))
            self.waiting.insert(index, request)
        elif front:
            self.waiting.appendleft(request)
        else:
            self.waiting.append(request)

    def _image_budget(self, request: Request, start: int, num_new: int, encoder_budget: int) -> tuple[int, int]:
        """A vision-language chunk within the step's encoder budget (--max-num-encoder-input-tokens) and the encoder cache:
        cut before the first image that is not held and does not fit what is left of the budget (an image larger than a
        whole budget runs in a step of its own), or before the first image the cache has no room for beside the images
        this step uses; returns (num_new, the image tokens the chunk makes the vision graph run)."""
        cost, held, new = 0, set(), set()
        for placed in sorted(covered(request.images, start, start + num_new), key=lambda p: p.offset):
            digest, cut = placed.image.digest, max(placed.offset - start, 0)
            if self.encoder_cache.has(digest):
                if len(new) > self.encoder_cache.room(held | {digest}):
                    return cut, cost
                held.add(digest)
            elif digest not in new:
                size = placed.image.num_positions
                if cost + size > encoder_budget and not (cost == 0 and encoder_budget == self.config.max_num_encoder_input_tokens):
                    return cut, cost
                if len(new) + 1 > self.encoder_cache.room(held):
                    return cut, cost
                new.add(digest)
                cost += size
        return num_new, cost

    def _use_images(self, request: Request, start: int, num_new: int, cost: int) -> int:
        """Holds the images a scheduled chunk covers through the step, allocating those not held (the runner encodes
        them this step); returns `cost`."""
        images = covered(request.images, start, start + num_new)
        for placed in images:
            if self.encoder_cache.has(placed.image.digest):
                self.encoder_cache.use(placed.image.digest)
        for placed in images:
            if not self.encoder_cache.has(placed.image.digest):
                self.encoder_cache.allocate(placed, self._still_needed)
        return cost

    def _still_needed(self) -> set[str]:
        """The digests of the images unfinished requests have unprocessed tokens over."""
        return {p.image.digest for r in (*self.running, *self.waiting) for p in r.images if p.end > r.num_computed_tokens}

    @staticmethod
    def _whole_images(request: Request, start: int, num_new: int) -> int:
        """`num_new` cut so that a prefill chunk does not end inside an image whose tokens attend both ways (Gemma 3)."""
        return whole_image_chunk(request.images, start, num_new) if request.images else num_new

    def _cap(self, num_new: int) -> int:
        threshold = self.config.long_prefill_token_threshold
        return min(num_new, threshold) if threshold else num_new

    def schedule(self) -> SchedulerOutput:
        """Picks this step's requests and token counts and allocates their blocks."""
        budget = self.config.max_num_batched_tokens
        chosen: list[tuple[Request, int]] = []
        preempted: list[str] = []

        index = 0
        self.drafts = {}
        self.encoder_cache.begin_step()
        encoder_budget = self.config.max_num_encoder_input_tokens
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            start = request.num_computed_tokens
            num_new = self._whole_images(request, start, self._cap(min(request.num_tokens - start, budget)))
            num_new, image_cost = self._image_budget(request, start, num_new, encoder_budget)
            if num_new == 0:  # its next chunk is an image it must take whole, or one the step's encoder budget cannot run
                index += 1
                continue
            drafts = self._propose(request, budget) if num_new == 1 else []
            if drafts and self.kv_cache.allocate_slots(request, 1 + len(drafts)) is not None:
                self.drafts[request.request_id] = drafts
                encoder_budget -= self._use_images(request, start, 1, image_cost)
                chosen.append((request, 1))
                budget -= 1 + len(drafts)
                index += 1
                continue
            if self.kv_cache.allocate_slots(request, num_new) is not None:
                chosen.append((request, num_new))
                budget -= num_new
                encoder_budget -= self._use_images(request, start, num_new, image_cost)
                index += 1
                continue
            victim = self._victim()
            position = self.running.index(victim)
            self.running.pop(position)
            if position < index:  # scheduled earlier in this step (priority policy): its tokens go back to the budget
                index -= 1
                num_taken = next(n for r, n in chosen if r is victim)
                chosen = [(r, n) for r, n in chosen if r is not victim]
                budget += num_taken + len(self.drafts.pop(victim.request_id, []))
            self._preempt(victim)
            preempted.append(victim.request_id)

        while not preempted and self.waiting and len(self.running) < self.config.max_num_seqs and budget > 0:
            request = self.waiting[0]
            encoder = request.encoder_input
            if encoder is not None and encoder_budget < min(encoder.num_positions, self.config.max_num_encoder_input_tokens):
                break  # the step's encoder work is spent (an input larger than the budget runs alone)
            hits, num_hit_tokens = self.kv_cache.get_computed_blocks(request)
            num_new = self._whole_images(request, num_hit_tokens, self._cap(min(request.num_tokens - num_hit_tokens, budget)))
            num_new, image_cost = self._image_budget(request, num_hit_tokens, num_new, encoder_budget)
            if num_new == 0 or self.kv_cache.allocate_slots(request, num_new, hits) is None:
                break
            encoder_budget -= self._use_images(request, num_hit_tokens, num_new, image_cost)
            if request.request_id in self.kv_cache.to_encode:
                encoder_budget -= encoder.num_positions
            self.waiting.popleft()
            self.kv_cache.record_prefix_lookup(request.num_tokens, num_hit_tokens)
            if request.first_scheduled_time is None:
                request.first_scheduled_time = time.monotonic()
                request.num_cached_tokens = num_hit_tokens
            request.num_computed_tokens = num_hit_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            chosen.append((request, num_new))
            budget -= num_new

        finished, self.finished_ids = frozenset(self.finished_ids), set()
        self.stats.num_steps += 1
        in_use = {p.image.digest for r, n in chosen for p in covered(r.images, r.num_computed_tokens, r.num_computed_tokens + n)}
        scheduled = tuple(self._scheduled(request, num_new) for request, num_new in chosen)
        encode_images, free_image_digests = self.encoder_cache.end_step(in_use)  # last: the frees are taken only here
        return SchedulerOutput(
            scheduled=scheduled,
            num_scheduled_tokens=self.config.max_num_batched_tokens - budget,
            finished_request_ids=finished,
            preempted_request_ids=tuple(preempted),
            encode_images=encode_images,
            free_image_digests=free_image_digests,
        )

    def _propose(self, request: Request, budget: int) -> list[int]:
        """Proposals for a decoding request (n-gram lookup now, or the draft model's from before the
        step), within its token, context and step budgets."""
        spec = self.config.speculative
        if spec is None or not can_speculate(request.sampling_params, request.options, request.num_output_tokens):
            return []
        if spec.disable_by_batch_size is not None and len(self.running) > spec.disable_by_batch_size:
            return []
        limit = min(budget - 1, self.proposal_limit(request))
        if spec.method == "draft_model":
            return self.proposals.get(request.request_id, [])[: max(limit, 0)]
        return propose_ngram(request.all_token_ids, spec, limit)

    def proposal_limit(self, request: Request) -> int:
        """The most proposals a request can use: k, within its max_tokens, the context length and the
        graph's longest query."""
        limit = min(self.config.speculative.num_speculative_tokens, self.config.max_model_len - request.num_tokens - 1)
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None:
            limit = min(limit, max_tokens - request.num_output_tokens - 1)
        if self.config.long_prefill_token_threshold:  # also the graph's longest query (WebGPU's paged attention)
            limit = min(limit, self.config.long_prefill_token_threshold - 1)
        return limit

    def speculation_candidates(self) -> list[tuple[Request, int]]:
        """Running requests that decode next step and may speculate, with their proposal limits."""
        spec = self.config.speculative
        if spec is None or (spec.disable_by_batch_size is not None and len(self.running) > spec.disable_by_batch_size):
            return []
        return [(r, self.proposal_limit(r)) for r in self.running
                if r.num_tokens - r.num_computed_tokens == 1 and can_speculate(r.sampling_params, r.options, r.num_output_tokens)]

    def _scheduled(self, request: Request, num_new: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        drafts = tuple(self.drafts.get(request.request_id, ()))
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=[*request.all_token_ids[start : start + num_new], *drafts],
            spec_token_ids=drafts,
            num_computed_tokens=start,
            block_ids=self.kv_cache.block_ids(request.request_id),
            sample=start + num_new == request.num_tokens,
            sampling_params=request.sampling_params,
            options=request.options,
            all_token_ids=request.all_token_ids,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            lora_slot=request.lora_slot,
            cross_block_ids=self.kv_cache.cross_block_ids(request.request_id),
            cross_len=request.encoder_input.num_positions if request.encoder_input is not None else 0,
            encoder_input=request.encoder_input if request.request_id in self.kv_cache.to_encode else None,
            images=request.images,
        )

    def _victim(self) -> Request:
        """The running request that gives way: the most recently admitted one (fcfs) or the least urgent
        (priority; the latest admitted among equals), which may have been scheduled earlier in the step."""
        if self.config.policy == "priority":
            return max(reversed(self.running), key=_urgency)
        return self.running[-1]

    def _preempt(self, request: Request) -> None:
        self.kv_cache.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.stats.num_preemptions += 1
        self._enqueue(request, front=True)

    def update_from_output(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput,
                           verdicts: dict[str, Verdict]) -> list[Request]:
        """Advances the scheduled requests, appends the tokens each verdict keeps (ortinf/runtime/core/stopping.py
        decides them), finishes the finished and frees their blocks. Returns the requests that
        produced a token or finished this step. A sampled request without a verdict (its format
        cannot continue, or judging it failed) only advances: the engine fails it."""
        changed = []
        self.encoder_cache.confirm(p.image.digest for s in scheduler_output.scheduled for p in
                                   covered(s.images, s.num_computed_tokens, s.num_computed_tokens + len(s.token_ids)))
        self.encoder_cache.settle()  # images allocated for chunks that did not run (failed alone) are freed
        for scheduled in scheduler_output.scheduled:
            request = self.requests.get(scheduled.request_id)
            if request is None or request.is_finished:
                continue  # aborted while the step ran
            if scheduled.num_computed_tokens < request.num_prompt_tokens:
                request.num_prefill_chunks += 1
            request.num_computed_tokens += len(scheduled.token_ids) - len(scheduled.spec_token_ids)
            verdict = verdicts.get(scheduled.request_id) if scheduled.sample else None
            if verdict is None:
                self.kv_cache.cache_blocks(request)
                continue
            tokens = runner_output.sampled_token_ids.get(scheduled.request_id, [])
            for token_id in tokens[: verdict.keep]:
                request.append_output_token(token_id)
            if scheduled.spec_token_ids:
                accepted = len(tokens) - 1  # the proposals kept: their K/V is computed, the last token's is not
                self.spec_stats.record(len(scheduled.spec_token_ids), accepted)
                request.num_computed_tokens += min(accepted, verdict.keep)
            self.kv_cache.cache_blocks(request)  # before finishing: a finished request's blocks stay as prefix hits
            if verdict.finish_reason is not None:
                self.finish_request(request.request_id, verdict.finish_reason, verdict.stop_reason)
            elif scheduled.spec_token_ids:
                self.kv_cache.trim(request)
            changed.append(request)
        return changed

    def finish_request(self, request_id: str, reason: FinishReason, stop_reason: int | str | None = None) -> None:
        """Ends a request (stop rule, stop string or abort) and frees its blocks at once."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return
        # a request is in one of the two lists, except mid-admission in a step that failed
        if request in self.running:
            self.running.remove(request)
        if request in self.waiting:
            self.waiting.remove(request)
        self.kv_cache.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.stop_reason = stop_reason
        self.finished_ids.add(request_id)

    def release(self, request_id: str) -> None:
        """Forgets a finished request once its output has been delivered."""
        request = self.requests.get(request_id)
        if request is not None and request.is_finished:
            del self.requests[request_id]


def _urgency(request: Request) -> tuple[int, float]:
    return request.priority, request.arrival_time
