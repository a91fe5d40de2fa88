"""The scheduler alone, over a real KV cache manager and no graph: the token budget, chunked prefill,
running-first order, max_num_seqs, preemption of the latest admitted, prefix-cache hits, and applying
verdicts (ortinf/runtime/core/stopping.py) after a step."""

from __future__ import annotations

from ortinf.runtime.core.kv_cache_manager import KVCacheManager
from ortinf.runtime.core.request import FinishReason, Request, RequestStatus
from ortinf.runtime.core.scheduler import Scheduler, SchedulerConfig
from ortinf.runtime.core.stopping import Verdict
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.worker.scheduler_output import ModelRunnerOutput, SchedulerOutput

BLOCK = 4


def make(num_blocks: int = 64, caching: bool = False, **config) -> Scheduler:
    config.setdefault("max_model_len", 512)
    return Scheduler(SchedulerConfig(**config), KVCacheManager(num_blocks, BLOCK, caching))


def add(scheduler: Scheduler, request_id: str, prompt: list[int], max_tokens: int = 8) -> Request:
    request = Request(request_id, prompt, SamplingParams(max_tokens=max_tokens), eos_token_ids=(2,))
    scheduler.add_request(request)
    return request


def finish_step(scheduler: Scheduler, out: SchedulerOutput, token: int = 7, verdicts: dict[str, Verdict] | None = None) -> list[Request]:
    """What the engine does after a step: one token for each sampled request, kept unless told otherwise."""
    sampled = {s.request_id: [token] for s in out.scheduled if s.sample}
    verdicts = verdicts if verdicts is not None else {rid: Verdict(1) for rid in sampled}
    return scheduler.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled), verdicts)


def scheduled(out: SchedulerOutput) -> dict[str, int]:
    return {s.request_id: len(s.token_ids) for s in out.scheduled}


def test_chunked_prefill_under_the_token_budget_running_first():
    scheduler = make(max_num_batched_tokens=64)
    add(scheduler, "a", list(range(3, 103)))  # 100 tokens
    add(scheduler, "b", list(range(3, 53)))  # 50
    first = scheduler.schedule()
    assert scheduled(first) == {"a": 64} and not first.scheduled[0].sample
    finish_step(scheduler, first)
    second = scheduler.schedule()
    assert scheduled(second) == {"a": 36, "b": 28}  # the running request catches up first
    assert [s.sample for s in second.scheduled] == [True, False]
    finish_step(scheduler, second)
    third = scheduler.schedule()
    assert scheduled(third) == {"a": 1, "b": 22} and all(s.sample for s in third.scheduled)
    assert third.num_scheduled_tokens == 23


def test_max_num_seqs_keeps_the_rest_waiting():
    scheduler = make(max_num_seqs=2)
    for name in "abc":
        add(scheduler, name, [5, 6, 7])
    out = scheduler.schedule()
    assert set(scheduled(out)) == {"a", "b"} and [r.request_id for r in scheduler.waiting] == ["c"]


def test_preemption_takes_the_latest_admitted_and_requeues_it_first():
    scheduler = make(num_blocks=5)  # 20 slots
    a = add(scheduler, "a", list(range(3, 11)), max_tokens=40)  # 2 blocks
    b = add(scheduler, "b", list(range(3, 11)), max_tokens=40)  # 2 blocks
    finish_step(scheduler, scheduler.schedule())
    assert scheduler.kv_cache.num_free_blocks == 1
    preempted = None
    for _ in range(8):
        out = scheduler.schedule()
        if out.preempted_request_ids:
            preempted = out
            break
        finish_step(scheduler, out)
    assert preempted is not None and preempted.preempted_request_ids == ("b",)
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert scheduler.waiting[0] is b and b.output_token_ids  # it keeps what it generated, to recompute later
    assert "b" not in scheduler.kv_cache.req_to_blocks and scheduled(preempted) == {"a": 1}
    assert a.status == RequestStatus.RUNNING


def _urgent(scheduler: Scheduler, request_id: str, length: int, priority: int, arrival: float) -> Request:
    request = Request(request_id, list(range(3, 3 + length)), SamplingParams(max_tokens=40), eos_token_ids=(2,),
                      arrival_time=arrival, priority=priority)
    scheduler.add_request(request)
    return request


def test_priority_policy_admits_the_most_urgent_first_and_preempts_the_least():
    scheduler = make(num_blocks=5, max_num_seqs=2, policy="priority")
    low = _urgent(scheduler, "low", 8, priority=5, arrival=0.0)
    _urgent(scheduler, "urgent", 8, priority=-1, arrival=1.0)
    _urgent(scheduler, "tie", 4, priority=-1, arrival=2.0)
    assert [r.request_id for r in scheduler.waiting] == ["urgent", "tie", "low"]  # priority, then arrival
    assert set(scheduled(scheduler.schedule())) == {"urgent", "tie"} and low.status == RequestStatus.WAITING
    # under memory pressure the least urgent running request gives way, though it was admitted first
    pressure = make(num_blocks=5, policy="priority")
    first = _urgent(pressure, "first", 8, priority=9, arrival=0.0)
    finish_step(pressure, pressure.schedule())
    second = _urgent(pressure, "second", 8, priority=0, arrival=1.0)
    finish_step(pressure, pressure.schedule())
    assert pressure.running == [first, second]  # fcfs would preempt second, the latest admitted
    for _ in range(8):
        out = pressure.schedule()
        if out.preempted_request_ids:
            break
        finish_step(pressure, out)
    assert out.preempted_request_ids == ("first",) and second.status == RequestStatus.RUNNING
    assert pressure.waiting[0] is first and first.num_preemptions == 1


def test_a_shared_prefix_is_a_cache_hit_in_whole_blocks():
    scheduler = make(caching=True)
    prefix = list(range(3, 13))  # 10 tokens: 2 full blocks
    add(scheduler, "a", [*prefix, 40, 41])
    finish_step(scheduler, scheduler.schedule())
    b = add(scheduler, "b", [*prefix, 50, 51, 52])
    out = scheduler.schedule()
    assert b.num_cached_tokens == 8 and scheduled(out)["b"] == 13 - 8
    assert scheduler.kv_cache.stats.num_hits == 8


def test_verdicts_append_only_what_they_keep_and_finish_frees_the_blocks():
    scheduler = make()
    a = add(scheduler, "a", [5, 6, 7])
    b = add(scheduler, "b", [5, 6, 8])
    out = scheduler.schedule()
    runner = ModelRunnerOutput(sampled_token_ids={"a": [9], "b": [9]})
    changed = scheduler.update_from_output(out, runner, {"a": Verdict(1, FinishReason.STOP, "x"), "b": Verdict(1)})
    assert changed == [a, b]
    assert a.is_finished and a.finish_reason == FinishReason.STOP and a.stop_reason == "x" and "a" not in scheduler.kv_cache.req_to_blocks
    assert b.output_token_ids == [9] and b.num_computed_tokens == 3 and not b.is_finished
    assert scheduler.schedule().finished_request_ids == frozenset({"a"})  # told to the model runner once
    scheduler.release("a")
    assert "a" not in scheduler.requests


def test_a_request_without_a_verdict_only_advances():
    """A sampled request that the engine fails (its format cannot continue) gets no tokens and is not reported."""
    scheduler = make()
    a = add(scheduler, "a", [5, 6, 7])
    out = scheduler.schedule()
    changed = scheduler.update_from_output(out, ModelRunnerOutput(cannot_continue={"a": "no token"}), {})
    assert changed == [] and a.output_token_ids == [] and a.num_computed_tokens == 3


def test_speculative_tokens_count_as_computed_up_to_the_kept_ones():
    """With proposals, the accepted ones' K/V is computed; a verdict that keeps fewer (a stop in the
    middle) finishes the request with only those."""
    from ortinf.config import SpeculativeConfig

    scheduler = make(speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2))
    request = add(scheduler, "a", [5, 6, 7, 5, 6, 7, 5, 6], max_tokens=20)
    finish_step(scheduler, scheduler.schedule(), token=7)
    out = scheduler.schedule()
    spec = out.scheduled[0].spec_token_ids
    assert spec == (5, 6, 7)  # the n-gram after "6 7" earlier in the text
    runner = ModelRunnerOutput(sampled_token_ids={"a": [5, 6, 7, 9]})  # all accepted, plus one
    scheduler.update_from_output(out, runner, {"a": Verdict(2, FinishReason.STOP, "x")})
    assert request.output_token_ids == [7, 5, 6] and request.is_finished
    assert scheduler.spec_stats.num_accepted_tokens == 3
