"""The async engine: concurrent streams, abort by closing a stream, errors reaching the caller."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from support.engine_helpers import hf_greedy, make_engine

from ortinf.errors import RequestError
from ortinf.runtime.engine.async_engine import AsyncEngine
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.tasks import driver
from ortinf.tasks.programs import Samples


@pytest.fixture
def engine_and_model(decoder_package):
    model, package = decoder_package("llama")
    engine = AsyncEngine(make_engine(package))
    yield engine, model
    engine.shutdown()


async def collect(engine: AsyncEngine, prompt, params):
    outputs = [output async for output in engine.generate(prompt, params)]
    return outputs


def test_concurrent_streams_match_transformers(engine_and_model):
    engine, model = engine_and_model
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 256, int(n)).tolist() for n in rng.integers(4, 80, 8)]
    params = SamplingParams(temperature=0, max_tokens=12)

    async def main():
        return await asyncio.gather(*(collect(engine, p, params) for p in prompts))

    results = asyncio.run(main())
    for prompt, outputs in zip(prompts, results):
        assert outputs[-1].finished and all(not o.finished for o in outputs[:-1])
        lengths = [len(o.outputs[0].token_ids) for o in outputs]
        assert lengths == sorted(lengths)  # cumulative outputs, one token more per step
        assert outputs[-1].outputs[0].token_ids == hf_greedy(model, prompt, 12)


def test_closing_a_stream_aborts_and_frees(engine_and_model):
    engine, _ = engine_and_model
    kv = engine.engine.kv_cache

    async def main():
        stream = engine.generate([5] * 40, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                break  # the client goes away mid-generation
        await stream.aclose()

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while (kv.req_to_blocks or engine.engine.has_unfinished_requests()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not kv.req_to_blocks and kv.num_free_blocks == kv.pool.num_blocks
    assert engine.num_unfinished == 0


def test_invalid_request_raises_before_running(engine_and_model):
    engine, _ = engine_and_model

    async def main():
        with pytest.raises(RequestError, match="context length"):
            await collect(engine, [5] * 500, SamplingParams(max_tokens=100))

    asyncio.run(main())
    assert engine.num_unfinished == 0 and engine.is_alive


def test_one_mailbox_for_several_requests_joins_what_a_slow_reader_missed(engine_and_model):
    """The driver's stream (ortinf/tasks/driver.py): n requests through one mailbox; a reader that sleeps through
    many steps gets one joined delta per request (never a backlog), and the joined deltas are transformers' tokens."""
    engine, model = engine_and_model
    prompts = [[5, 9, 13], [7, 7, 7, 7, 7], [3, 100, 200, 50]]
    prepared = [engine.engine.prepare(p, SamplingParams(temperature=0, max_tokens=16), output_kind="delta") for p in prompts]

    async def main():
        tokens: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
        takes = 0
        async for index, output in driver.stream(engine, Samples(prepared, keep=False), "m"):
            assert output.delta
            tokens[index] += output.outputs[0].token_ids
            takes += 1
            await asyncio.sleep(0.3)  # many engine steps pass while the reader sleeps
        return tokens, takes

    tokens, takes = asyncio.run(main())
    for index, prompt in enumerate(prompts):
        assert tokens[index] == hf_greedy(model, prompt, 16)
    assert takes < 3 * 16  # deltas were joined, not queued one per step
    assert engine.num_unfinished == 0


def test_after_fail_all_new_requests_get_the_same_error(engine_and_model):
    """The drain deadline (fail_all) also refuses what registers after it: a beam search between two steps, or a
    request still preparing, must not start requests that run past the deadline."""
    engine, _ = engine_and_model
    from ortinf.errors import ShuttingDownError

    async def main():
        engine.fail_all(ShuttingDownError("closing"))
        with pytest.raises(ShuttingDownError, match="closing"):
            await collect(engine, [5, 9, 13], SamplingParams(max_tokens=4))

    asyncio.run(main())
