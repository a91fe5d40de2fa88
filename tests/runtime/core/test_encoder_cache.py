"""The scheduler's encoder cache (ortinf/runtime/core/encoder_cache.py) decides which image embeddings the model runner
holds: over a real KV cache manager and a stand-in runner that holds exactly what each step says, a small cache and
interleaving requests never leave a step without an embedding it needs, never encode a held image again, never hold
more than the capacity, and a step that failed (or whose requests failed alone) leaves no image taken as held."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ortinf.runtime.core.encoder_cache import EncoderCache
from ortinf.runtime.core.kv_cache_manager import KVCacheManager
from ortinf.runtime.core.request import FinishReason, Request, RequestStatus
from ortinf.runtime.core.scheduler import Scheduler, SchedulerConfig
from ortinf.runtime.core.stopping import Verdict
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage, covered
from ortinf.runtime.worker.scheduler_output import ModelRunnerOutput, SchedulerOutput


def image(name: str, offset: int, size: int = 8) -> PlacedImage:
    return PlacedImage(offset, EncoderInput(np.zeros(1, np.float32), size, f"image:{name}"))


def make(capacity: int, **config) -> Scheduler:
    scheduler = Scheduler(SchedulerConfig(max_model_len=256, **config), KVCacheManager(64, 4, False))
    scheduler.encoder_cache = EncoderCache(capacity)
    return scheduler


def add(scheduler: Scheduler, request_id: str, length: int, images: tuple[PlacedImage, ...], max_tokens: int = 3) -> Request:
    request = Request(request_id, list(range(3, 3 + length)), SamplingParams(max_tokens=max_tokens), eos_token_ids=(2,), images=images)
    scheduler.add_request(request)
    return request


class Runner:
    """The model runner's side: holds exactly what the steps say, and checks every chunk finds its images."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: set[str] = set()
        self.encoded: list[str] = []
        self.most_in_use = 0

    def execute(self, out: SchedulerOutput) -> None:
        self.held.difference_update(out.free_image_digests)
        for placed in out.encode_images:
            assert placed.image.digest not in self.held, f"{placed.image.digest} encoded again while held"
            self.held.add(placed.image.digest)
            self.encoded.append(placed.image.digest)
        in_use = {p.image.digest for s in out.scheduled for p in covered(s.images, s.num_computed_tokens,
                                                                          s.num_computed_tokens + len(s.token_ids))}
        assert in_use <= self.held, f"the step needs {in_use - self.held}, which the runner does not hold"
        assert len(self.held) <= self.capacity
        self.most_in_use = max(self.most_in_use, len(in_use))


def finish_step(scheduler: Scheduler, out: SchedulerOutput) -> None:
    """One token for each sampled request; max_tokens finishes it."""
    sampled = {s.request_id: [7] for s in out.scheduled if s.sample}
    verdicts = {rid: Verdict(1, FinishReason.LENGTH if s.num_output_tokens + 1 >= s.sampling_params.max_tokens else None)
                for s in out.scheduled for rid in [s.request_id] if rid in sampled}
    scheduler.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled), verdicts)


def test_a_small_cache_and_interleaved_requests_keep_the_runner_in_step():
    scheduler, runner = make(2, max_num_batched_tokens=18, long_prefill_token_threshold=6, max_num_seqs=3), Runner(2)
    requests = [add(scheduler, "a", 24, (image("a1", 2), image("a2", 13))), add(scheduler, "b", 20, (image("b", 3),)),
                add(scheduler, "c", 20, (image("c", 1),))]
    for _ in range(60):
        if not scheduler.num_unfinished:
            break
        out = scheduler.schedule()
        runner.execute(out)
        assert runner.held == set(scheduler.encoder_cache.held)  # the two agree after every step
        finish_step(scheduler, out)
    assert all(r.status == RequestStatus.FINISHED for r in requests)
    assert sorted(set(runner.encoded)) == ["image:a1", "image:a2", "image:b", "image:c"] and runner.most_in_use == 2
    # a fourth request re-sends c's image while it is held: no second encode
    again = add(scheduler, "d", 20, (image("c", 5),))
    count = len(runner.encoded)
    while again.status != RequestStatus.FINISHED:
        out = scheduler.schedule()
        runner.execute(out)
        finish_step(scheduler, out)
    assert len(runner.encoded) == count


def test_a_full_cache_frees_an_image_no_request_still_needs_and_never_one_in_use():
    cache = EncoderCache(2)
    cache.begin_step()
    cache.allocate(image("1", 0), set)
    cache.allocate(image("2", 0), set)
    cache.end_step({"image:1", "image:2"})
    cache.confirm(["image:1", "image:2"])
    cache.begin_step()
    third = image("3", 0)
    cache.allocate(third, lambda: {"image:1"})  # the least recent (1) is still needed: 2 goes
    assert list(cache.held) == ["image:1", "image:3"] and cache.end_step({"image:3"}) == ((third,), ("image:2",))
    cache.confirm(["image:3"])
    cache.begin_step()
    cache.use("image:1")
    cache.use("image:3")
    assert cache.room() == 0
    with pytest.raises(RuntimeError, match="all in use"):
        cache.allocate(image("4", 0), set)
    # the scheduler's view of what is still needed: the images ahead of each unfinished request's computed tokens
    scheduler = make(2, max_num_batched_tokens=6)
    add(scheduler, "a", 30, (image("x", 0, 4), image("y", 20, 4)), max_tokens=1)
    add(scheduler, "b", 30, (image("z", 0, 4),), max_tokens=1)
    for _ in range(4):  # a runs [0, 24) (x, then y); b waits for the token budget
        finish_step(scheduler, scheduler.schedule())
    assert set(scheduler.encoder_cache.held) == {"image:x", "image:y"} and scheduler._still_needed() == {"image:z"}


def test_the_cache_cuts_a_chunk_before_an_image_it_has_no_room_for():
    scheduler = make(1, max_num_batched_tokens=40)
    request = add(scheduler, "a", 30, (image("p", 2, 4), image("q", 10, 4)))
    out = scheduler.schedule()
    assert [len(s.token_ids) for s in out.scheduled] == [10]  # q must wait for p's room: p is in use in this step
    assert [p.image.digest for p in out.encode_images] == ["image:p"]
    finish_step(scheduler, out)
    out = scheduler.schedule()  # p is done: freed for q
    assert out.free_image_digests == ("image:p",) and [p.image.digest for p in out.encode_images] == ["image:q"]
    assert request.num_computed_tokens == 10 and len(out.scheduled[0].token_ids) == 20


def test_a_failed_step_leaves_no_image_taken_as_held():
    scheduler = make(4, max_num_batched_tokens=40)
    add(scheduler, "a", 12, (image("x", 2),))
    add(scheduler, "b", 12, (image("y", 2),))
    out = scheduler.schedule()
    assert {p.image.digest for p in out.encode_images} == {"image:x", "image:y"}
    # the engine re-ran the step one request at a time and b failed alone: only a's image is held
    finish_step(scheduler, replace(out, scheduled=out.scheduled[:1]))
    scheduler.finish_request("b", FinishReason.ABORT)
    assert set(scheduler.encoder_cache.held) == {"image:x"}
    add(scheduler, "c", 12, (image("z", 2),))
    out = scheduler.schedule()  # the runner drops y (it may have encoded it) with the next step
    assert out.free_image_digests == ("image:y",) and [p.image.digest for p in out.encode_images] == ["image:z"]
    # the whole step failed (no update): the next schedule frees what it allocated
    scheduler.finish_request("c", FinishReason.ABORT)
    out = scheduler.schedule()
    assert out.free_image_digests == ("image:z",) and set(scheduler.encoder_cache.held) == {"image:x"}


def test_an_image_freed_and_allocated_again_in_one_step_stays_with_the_runner():
    """A step that fails as a whole settles its image X; the next step sends X again (S) beside a text request (T).
    The step's output must not both free and encode X; the batched call fails, and the engine re-runs S and T one by
    one (LLMEngine._execute_one_by_one: the step's frees applied once, by the batched call). X then stays held on
    both sides, and a later request with X finds its embeddings."""
    held: set[str] = set()

    def execute(out: SchedulerOutput, frees: bool = True) -> None:  # the runner's vision part (model_runner.execute)
        for digest in out.free_image_digests if frees else ():
            held.discard(digest)
        needed = {p.image.digest for s in out.scheduled
                  for p in covered(s.images, s.num_computed_tokens, s.num_computed_tokens + len(s.token_ids))}
        held.update(p.image.digest for p in out.encode_images if p.image.digest in needed)
        assert needed <= held, f"no embeddings for {needed - held}"

    scheduler = make(8)
    add(scheduler, "R", 16, (image("X", 2),))
    scheduler.schedule()  # fails as a whole: no update_from_output
    scheduler.finish_request("R", FinishReason.ABORT)
    add(scheduler, "S", 16, (image("X", 2),))
    add(scheduler, "T", 16, ())
    out = scheduler.schedule()
    assert "image:X" not in out.free_image_digests and [p.image.digest for p in out.encode_images] == ["image:X"]
    for digest in out.free_image_digests:  # the batched call: frees first, then it fails
        held.discard(digest)
    for item in out.scheduled:
        execute(replace(out, scheduled=(item,), finished_request_ids=frozenset()), frees=False)
    scheduler.update_from_output(out, ModelRunnerOutput(), {})
    assert scheduler.encoder_cache.has("image:X") and held == {"image:X"}
    add(scheduler, "U", 16, (image("X", 2),))
    later = scheduler.schedule()
    assert not later.encode_images
    execute(later)
