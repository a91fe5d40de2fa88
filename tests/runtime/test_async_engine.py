"""The async engine: concurrent streams, abort by closing a stream, errors reaching the caller."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from engine_helpers import hf_greedy, make_engine
from ortinf.errors import RequestError
from ortinf.runtime.async_engine import AsyncEngine
from ortinf.runtime.sampling_params import SamplingParams


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
