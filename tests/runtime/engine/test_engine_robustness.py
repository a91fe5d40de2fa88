"""Failure isolation, prompt logprobs under caching and preemption, thread safety, dead-engine
streams: on a real LLMEngine over a tiny exported llama."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
from support.engine_helpers import drain, make_engine, run_to_completion
from support.fault_injection import FaultInjection

from ortinf import LLM
from ortinf.errors import StepFailedError
from ortinf.runtime.engine.async_engine import MAX_FAILED_STEPS, AsyncEngine, EngineDeadError
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.sample.structured_output import StructuredOutput

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPTS = [[(11 * i + 7 * j) % 250 + 3 for j in range(8 + 9 * i)] for i in range(4)]


def prompt_logprob_values(output) -> list[tuple[int, float]]:
    assert output.prompt_logprobs[0] is None
    return [(e.token_id, round(e.logprob, 5)) for e in output.prompt_logprobs[1:]]


def test_prompt_logprobs_ignore_the_prefix_cache(decoder_package):
    """The same 45-token prompt twice, prefix caching on: both calls return all 44 logprobs, equal
    to the values with caching off (the second call used to skip the cached rows)."""
    _, package = decoder_package("llama")
    prompt = [(7 * i + 3) % 250 + 3 for i in range(45)]
    params = SamplingParams(max_tokens=0, prompt_logprobs=3)
    results = []
    for caching in (True, False):
        engine = make_engine(package, enable_prefix_caching=caching)
        for _ in range(3):
            output = run_to_completion(engine, [prompt], params)
            results.append(prompt_logprob_values(next(iter(output.values()))))
    assert all(len(r) == 44 for r in results)
    assert all(r == results[0] for r in results)
    engine = make_engine(package)
    run_to_completion(engine, [prompt], GREEDY)  # the cache holds the prompt's blocks
    cached = run_to_completion(engine, [prompt], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))
    assert prompt_logprob_values(next(iter(cached.values()))) == [(t, lp) for t, lp in results[0]]


def test_prompt_logprobs_survive_preemption_mid_prefill(decoder_package):
    """A pool too small for both requests: the prompt-logprobs request is preempted during its
    chunked prefill and recomputed; its logprobs are those of a solo run, each position once."""
    _, package = decoder_package("llama")
    long_runner = [(3 * i) % 250 + 3 for i in range(100)]  # 7 blocks of 16; its 113th token needs an 8th
    scored = [(13 * i + 1) % 250 + 3 for i in range(70)]
    solo = run_to_completion(make_engine(package, max_model_len=128), [scored], SamplingParams(max_tokens=1, prompt_logprobs=1))
    expected = prompt_logprob_values(next(iter(solo.values())))
    engine = make_engine(package, num_blocks=9, max_model_len=128, max_num_batched_tokens=16)
    first = engine.add_request(long_runner, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    while engine.scheduler.requests[first].num_tokens < 106:  # decoding; 2 blocks left when the scored one arrives
        engine.step()
    second = engine.add_request(scored, SamplingParams(max_tokens=1, prompt_logprobs=1))
    outputs = drain(engine, [first, second])
    assert engine.scheduler.stats.num_preemptions > 0
    got = outputs[second]
    assert len(got.prompt_logprobs) == len(scored)
    values = prompt_logprob_values(got)
    assert [t for t, _ in values] == [t for t, _ in expected]
    np.testing.assert_allclose([lp for _, lp in values], [lp for _, lp in expected], atol=1e-4)  # other chunking


def test_a_poisoned_request_fails_alone_and_frees_its_blocks(decoder_package):
    _, package = decoder_package("llama")
    reference = run_to_completion(make_engine(package), PROMPTS, GREEDY)
    engine = make_engine(package)
    used = {t for p in PROMPTS for t in p} | {t for o in reference.values() for t in o.outputs[0].token_ids}
    poison = next(t for t in range(255, 3, -1) if t not in used)  # a token no healthy request reads or makes
    FaultInjection(token_id=poison).install(engine.runner)
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    bad = engine.add_request([4, poison, 4], GREEDY)
    outputs = drain(engine, [*ids, bad])  # invariants each step; every block free at the end
    assert isinstance(outputs[bad].error, StepFailedError) and outputs[bad].finished
    for request_id, expected in zip(ids, reference.values()):
        assert outputs[request_id].error is None
        assert outputs[request_id].outputs[0].token_ids == expected.outputs[0].token_ids
    assert engine.num_failed_steps_in_a_row == 0  # explained by a request: not an engine failure


def test_llm_generate_from_two_threads(decoder_package):
    _, package = decoder_package("llama")
    llm = LLM(package, provider="cpu", num_blocks=256)
    expected = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for _ in range(3):
                results[index] = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert not errors and results == {0: expected, 1: expected}


def test_a_dead_engine_fails_every_stream_and_refuses_new_ones(decoder_package):
    """Every graph call fails: the first MAX_FAILED_STEPS requests get StepFailedError, then the
    engine is dead; open streams get EngineDeadError, later ones fail at once (never hang)."""
    _, package = decoder_package("llama")
    deaths: list[BaseException] = []
    engine = make_engine(package)
    FaultInjection(after_steps=1).install(engine.runner)
    engine = AsyncEngine(engine, on_dead=deaths.append)

    async def run(prompt) -> BaseException | None:
        try:
            async for _ in engine.generate(prompt, GREEDY):
                pass
        except Exception as exc:  # noqa: BLE001
            return exc
        return None

    async def main() -> list:
        errors = [await run(PROMPTS[0]) for _ in range(MAX_FAILED_STEPS - 1)]
        errors += await asyncio.gather(*(run(p) for p in PROMPTS))  # one failing step: the last straw
        errors.append(await asyncio.wait_for(run(PROMPTS[0]), 5))
        return errors

    errors = asyncio.run(main())
    engine.shutdown()  # joins the engine thread, which calls on_dead after failing the streams
    assert all(isinstance(e, StepFailedError) for e in errors[: MAX_FAILED_STEPS - 1])
    assert all(isinstance(e, (StepFailedError, EngineDeadError)) for e in errors)
    assert isinstance(errors[-1], EngineDeadError)
    assert len(deaths) == 1 and not engine.is_alive
    kv = engine.engine.kv_cache
    assert kv.num_free_blocks == kv.pool.num_blocks


def test_a_stalled_reader_gets_the_latest_output_not_a_backlog(decoder_package):
    _, package = decoder_package("llama")
    engine = AsyncEngine(make_engine(package))

    async def main() -> list:
        seen = []
        async for output in engine.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)):
            seen.append(len(output.outputs[0].token_ids))
            if len(seen) == 1:  # the reader stalls until the engine has finished the request
                deadline = time.monotonic() + 60
                while engine.engine.has_unfinished_requests() and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
        return seen

    try:
        seen = asyncio.run(main())
    finally:
        engine.shutdown()
    # coalesced: the latest output, not 39 queued ones (one output only where the engine finished before the reader's
    # first read: a busy machine's event loop)
    assert seen[-1] == 40 and len(seen) <= 2, seen


def test_shutdown_ends_open_streams(decoder_package):
    _, package = decoder_package("llama")
    engine = AsyncEngine(make_engine(package))

    async def main() -> BaseException | None:
        stream = engine.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
        await stream.__anext__()
        threading.Thread(target=engine.shutdown).start()
        try:
            async for _ in stream:
                pass
        except EngineDeadError as exc:
            return exc
        return None

    started = time.monotonic()
    assert isinstance(asyncio.run(asyncio.wait_for(main(), 30)), EngineDeadError)
    assert time.monotonic() - started < 30
    np.testing.assert_equal(engine.is_alive, False)


def test_a_retried_step_samples_what_a_clean_step_would(decoder_package, monkeypatch):
    """A step that fails after sampling (here: prompt logprobs, once) is re-run request by request;
    the sampling state it had advanced (seeded generators, the shared one, grammar matchers) is put
    back first, so the retry draws exactly the tokens of a run without the failure."""
    from ortinf.runtime.worker import model_runner

    _, package = decoder_package("llama")
    seeded = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=7, prompt_logprobs=1)
    unseeded = SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)
    grammar = SamplingParams(temperature=1.0, max_tokens=6, seed=3, structured_output=StructuredOutput("regex", "[a-z]{3,12}"))

    def run() -> list[list[int]]:
        engine = make_engine(package, seed=11)
        ids = [engine.add_request(PROMPTS[0], seeded), engine.add_request(PROMPTS[1], unseeded), engine.add_request(PROMPTS[2], grammar)]
        finished = drain(engine, ids)
        assert all(finished[i].error is None for i in ids)
        return [list(finished[i].outputs[0].token_ids) for i in ids]

    clean = run()
    original, calls = model_runner.prompt_logprobs, []

    def fails_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("transient fault after sampling")
        return original(*args)

    monkeypatch.setattr(model_runner, "prompt_logprobs", fails_once)
    assert run() == clean and len(calls) > 1
