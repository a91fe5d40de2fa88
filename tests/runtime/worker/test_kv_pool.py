"""The KV pool's sizing per provider, and the pool written in place by the graph itself."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from ortinf.config import EngineConfig
from ortinf.errors import ConfigError
from ortinf.manifest import DecoderSpec
from ortinf.providers import cpu, webgpu
from ortinf.providers.base import HOST_WRITE
from ortinf.providers.registry import Found, resolve
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.kv_pool import resolve_num_blocks
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

SPEC = DecoderSpec(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64, vocab_size=256,
                   max_model_len=512, kernel="portable", kv_dtype="fp32")
PER_BLOCK = 2 * 2 * 16 * 2 * 16 * 4  # K and V, layers, tokens, kv heads, head dim, bytes


def test_pool_size_from_memory_and_its_log(caplog):
    config = EngineConfig(package_dir=".", kv_cache_memory=100 * PER_BLOCK, max_num_seqs=1000)
    with caplog.at_level(logging.INFO):
        assert resolve_num_blocks(config, SPEC, 512, cpu.PROVIDER) == 100
    assert "100 blocks x 16 tokens = 1600 tokens" in caplog.text
    capped = EngineConfig(package_dir=".", kv_cache_memory=10**9, max_num_seqs=2)
    assert resolve_num_blocks(capped, SPEC, 512, cpu.PROVIDER) == 2 * 32 + 1  # no more than 2 full-length sequences use
    with pytest.raises(ConfigError, match="fewer than one sequence"):
        resolve_num_blocks(EngineConfig(package_dir=".", num_blocks=8), SPEC, 512, cpu.PROVIDER)


def test_device_pool_needs_a_size_and_respects_the_largest_tensor(caplog):
    with pytest.raises(ConfigError, match="--kv-cache-memory"):
        resolve_num_blocks(EngineConfig(package_dir="."), SPEC, 512, webgpu.PROVIDER)
    per_tensor_block = PER_BLOCK // 4  # one layer's K: 128 MiB holds 65536 blocks, one of them scratch
    big = EngineConfig(package_dir=".", num_blocks=100_000)
    with caplog.at_level(logging.WARNING):
        assert resolve_num_blocks(big, SPEC, 512, webgpu.PROVIDER) == 128 * 2**20 // per_tensor_block - 1
    assert "at most 128 MiB" in caplog.text


def test_the_graph_writes_new_kv_into_the_bound_pool(decoder_package):
    """The step's K/V land in exactly their slots of the bound pool; nothing else changes."""
    _, package = decoder_package("llama")
    graph = DecoderGraph(package, num_blocks=8, block_size=4, provider="cpu")
    before = [graph.read_pool(i).copy() for i in range(4)]
    graph.run(build_model_input([SequenceChunk([5, 6, 7, 8, 9], 0, [6, 2])], 4))  # slots 24..27, 8
    for i in range(4):
        after = graph.read_pool(i)
        changed = np.argwhere(np.any(after != before[i], axis=(0, 3)))  # (block, offset) pairs
        assert sorted(map(tuple, changed.tolist())) == [(2, 0), (6, 0), (6, 1), (6, 2), (6, 3)]
    # the host pool is the very memory the graph writes: no copy per step
    assert graph.pool.arrays[0].ctypes.data == graph.pool.values[0].data_ptr()


def test_host_write_and_graph_write_agree(decoder_package):
    """The package's two graphs (in-graph ScatterND, numpy write) give the same logits and the same pool."""
    _, package = decoder_package("llama")
    found = resolve("cpu")
    host_found = Found(dataclasses.replace(found.provider, kv_write=HOST_WRITE), found.devices)
    host = DecoderGraph(package, num_blocks=8, block_size=4, provider=host_found)
    # the portable graph on both sides: the CPU kernel graph's attention rounds differently (1e-7)
    graph = DecoderGraph(package, num_blocks=8, block_size=4, provider=found, cpu_kernel=False)
    assert not host.pool.graph_write and graph.pool.graph_write
    steps = [[SequenceChunk([5, 6, 7, 8, 9], 0, [6, 2])], [SequenceChunk([10], 5, [6, 2]), SequenceChunk([3, 4], 0, [1])]]
    for chunks in steps:
        model_input = build_model_input(chunks, 4)
        np.testing.assert_allclose(host.run(model_input), graph.run(model_input), atol=1e-5)
    for i in range(4):
        np.testing.assert_array_equal(host.read_pool(i), graph.read_pool(i))


def _resident(*arrays: np.ndarray) -> int:
    """Bytes of these arrays' pages in memory, by mincore(2): the arrays' own pages, not the process's RSS, which other
    threads of a long suite grow and shrink meanwhile (CI once measured +6 MB for a 64 MiB populated pool)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    page = 4096
    total = 0
    for array in arrays:
        start = array.ctypes.data // page * page
        length = array.ctypes.data + array.nbytes - start
        vector = (ctypes.c_ubyte * ((length + page - 1) // page))()
        assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vector) == 0, ctypes.get_errno()
        total += sum(byte & 1 for byte in vector) * page
    return total


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MAP_POPULATE"), reason="Linux's MAP_POPULATE")
def test_a_pool_is_mapped_now_or_in_the_background(monkeypatch):
    """A pool up to POPULATE_NOW is resident when the KVPool is made; a larger one's mapping is made without its pages
    and a thread maps them (the load no longer waits seconds for a default pool of 20% of the memory); zeros both."""
    from ortinf.runtime.worker import kv_pool

    spec = dataclasses.replace(SPEC, head_dim=64)
    blocks = 2048  # 2 layers x K/V x 2 heads x 2049 blocks x 16 tokens x 64 x 4 bytes = 64 MiB
    size = 4 * 2 * (blocks + 1) * 16 * 64 * 4
    now = kv_pool.KVPool(spec, blocks, 16, cpu.PROVIDER)
    assert sum(array.nbytes for array in now.arrays) == size
    assert now.populating is None and _resident(*now.arrays) > 0.9 * size
    lazy = kv_pool.reserved_zeros((size // 4,), np.float32, populate=False)
    assert _resident(lazy) < 0.1 * size  # mapped, not yet resident
    kv_pool.populate_in_background([lazy], "test").join(timeout=60)
    assert _resident(lazy) > 0.9 * size
    monkeypatch.setattr(kv_pool, "POPULATE_NOW", size // 2)
    later = kv_pool.KVPool(spec, blocks, 16, cpu.PROVIDER)
    assert later.populating is not None
    later.populating.join(timeout=60)
    assert _resident(*later.arrays) > 0.9 * size
    assert all(not array.any() for array in (*now.arrays, *later.arrays, lazy))
