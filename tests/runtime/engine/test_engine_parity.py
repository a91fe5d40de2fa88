"""Greedy engine outputs are token-identical to transformers' generate (fp32), for 16 prompts of
lengths 1..300 submitted together, across pool sizes, chunking, prefix caching and late arrivals."""

from __future__ import annotations

import numpy as np
import pytest
from support.engine_helpers import GREEDY, drain, hf_greedy, make_engine, run_to_completion

from ortinf.exporter.architectures import DECODERS
from ortinf.runtime.sample.sampling_params import SamplingParams

LENGTHS = [1, 2, 5, 17, 31, 64, 100, 128, 150, 199, 200, 233, 256, 270, 299, 300]


def make_prompts(seed: int, lengths=LENGTHS) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 256, n).tolist() for n in lengths]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request, decoder_package):
    model, package = decoder_package(request.param)
    prompts = make_prompts(11)
    expected = [hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    return model, package, prompts, expected


def token_lists(finished, ids):
    return [finished[i].outputs[0].token_ids for i in ids]


def test_big_pool(setup):
    _, package, prompts, expected = setup
    engine = make_engine(package, block_size=16, num_blocks=512)
    finished = run_to_completion(engine, prompts)
    assert token_lists(finished, [str(i) for i in range(16)]) == expected
    assert engine.scheduler.stats.num_preemptions == 0


def test_small_pool_preempts(setup):
    _, package, prompts, expected = setup
    engine = make_engine(package, block_size=16, num_blocks=40)  # ~180 blocks would hold everything
    finished = run_to_completion(engine, prompts)
    assert engine.scheduler.stats.num_preemptions > 0
    assert token_lists(finished, [str(i) for i in range(16)]) == expected


def test_chunked_prefill(setup):
    _, package, prompts, expected = setup
    engine = make_engine(package, max_num_batched_tokens=64)
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    chunks = {}
    def record(_step):
        for request_id in ids:
            request = engine.scheduler.requests.get(request_id)
            if request is not None:
                chunks[request_id] = request.num_prefill_chunks
    finished = drain(engine, ids, record)
    assert max(chunks.values()) >= 300 // 64  # the 300-token prompt took at least 4 chunks
    assert token_lists(finished, ids) == expected


def test_late_arrivals(setup):
    _, package, prompts, expected = setup
    engine = make_engine(package)
    ids = [engine.add_request(p, GREEDY) for p in prompts[:8]]
    late = iter(prompts[8:])

    def arrive(step):
        if step % 3 == 0:  # two more requests every third step, while others are mid-generation
            for prompt in (next(late, None), next(late, None)):
                if prompt is not None:
                    ids.append(engine.add_request(prompt, GREEDY))

    finished = drain(engine, ids, arrive)
    assert len(finished) == 16
    assert token_lists(finished, ids) == expected


def test_prefix_caching_on_and_off(setup):
    model, package, _, _ = setup
    rng = np.random.default_rng(5)
    prefix = rng.integers(3, 256, 200).tolist()
    prompts = [prefix + rng.integers(3, 256, n).tolist() for n in range(1, 49, 3)]
    expected = [hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    results = {}
    for caching in (True, False):
        engine = make_engine(package, enable_prefix_caching=caching)
        first = engine.add_request(prompts[0], GREEDY)
        engine.step()  # the first request's prefix blocks are now computed and cached
        ids = [first] + [engine.add_request(p, GREEDY) for p in prompts[1:]]
        finished = drain(engine, ids)
        results[caching] = token_lists(finished, ids)
        stats = engine.kv_cache.stats
        if caching:
            assert stats.num_hits >= 15 * 192  # 12 full blocks of the shared prefix per later request
            assert all(finished[i].num_cached_tokens == 192 for i in ids[1:])
        else:
            assert stats.num_hits == 0
    assert results[True] == results[False] == expected


def test_repeated_prompt_hit_is_capped(setup):
    """A prompt seen before, a whole number of blocks long: the hit stops one block short, so the
    last token is computed again and produces the same continuation."""
    model, package, _, _ = setup
    prompt = np.random.default_rng(9).integers(3, 256, 64).tolist()  # exactly 4 blocks of 16
    expected = hf_greedy(model, prompt, GREEDY.max_tokens)
    engine = make_engine(package)
    first = drain(engine, [engine.add_request(prompt, GREEDY)])
    second_id = engine.add_request(prompt, GREEDY)
    second = drain(engine, [second_id])
    assert second[second_id].num_cached_tokens == 48  # capped at num_tokens - 1, in whole blocks
    assert list(first.values())[0].outputs[0].token_ids == second[second_id].outputs[0].token_ids == expected


def test_shape_buckets_change_nothing(setup):
    """Steps padded to bucket shapes (padding sequences writing into the scratch block) on the CPU,
    with chunking and preemption: the same tokens."""
    _, package, prompts, expected = setup
    engine = make_engine(package, block_size=16, num_blocks=40, max_num_batched_tokens=64, shape_buckets=True)
    assert engine.graph.buckets is not None
    finished = run_to_completion(engine, prompts)
    assert engine.scheduler.stats.num_preemptions > 0
    assert token_lists(finished, [str(i) for i in range(16)]) == expected


@pytest.mark.parametrize("model_type", sorted(DECODERS))
def test_every_architecture_in_one_hard_run(model_type, decoder_package):
    """Every supported decoder, greedy against transformers token for token, in one run that has it all:
    ragged prompts sharing a prefix (prefix-cache hits), prompts longer than the sliding windows,
    prefill in chunks, and a pool small enough to preempt."""
    model, package = decoder_package(model_type)
    rng = np.random.default_rng(5)
    shared = rng.integers(3, 256, 32).tolist()
    prompts = [shared + rng.integers(3, 256, int(n)).tolist() for n in (1, 9, 30, 3, 17, 40)]
    expected = [hf_greedy(model, p, 16) for p in prompts]
    engine = make_engine(package, block_size=16, num_blocks=14, max_num_batched_tokens=48, enable_prefix_caching=True, max_model_len=128)
    first = run_to_completion(engine, prompts[:1], SamplingParams(temperature=0, max_tokens=16))  # caches the prefix
    finished = run_to_completion(engine, prompts[1:], SamplingParams(temperature=0, max_tokens=16))
    later = sorted(finished.values(), key=lambda o: int(o.request_id))
    assert [first["0"].outputs[0].token_ids, *(o.outputs[0].token_ids for o in later)] == expected
    assert engine.scheduler.stats.num_preemptions > 0 and engine.kv_cache.stats.num_hits > 0
