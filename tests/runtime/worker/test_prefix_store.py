"""The prefix cache on disk (--prefix-cache-dir, ortinf/runtime/worker/prefix_store.py): a new engine (a restart)
restores a long prompt's blocks instead of prefilling them, for every pool dtype (fp32, fp16, the CPU kernel's int8
rows), and its tokens equal those of an engine that computed everything; a truncated or corrupted file is ignored
with a warning; the folder stays within its budget."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from support.engine_helpers import drain, make_engine
from support.tiny_models import build_decoder

import ortinf
from ortinf.errors import ConfigError
from ortinf.kernels import library
from ortinf.runtime.sample.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPT = np.random.default_rng(3).integers(3, 250, 100).tolist()  # 6 full blocks of 16 and 4 tokens


def run(engine, prompt=PROMPT):  # noqa: ANN001
    request_id = engine.add_request(prompt, GREEDY)
    output = drain(engine, [request_id])[request_id]
    return output.outputs[0].token_ids, output.num_cached_tokens


def packages(tmp_path_factory) -> dict[str, tuple]:  # noqa: ANN001
    root = tmp_path_factory.mktemp("store")
    build_decoder("llama", root / "hf")
    made = {"fp32": (ortinf.export(root / "hf", root / "fp32", progress=False), root / "fp32", {"cpu_kernel": False}),
            "fp16": (ortinf.export(root / "hf", root / "fp16", kv_dtype="fp16", progress=False), root / "fp16", {"cpu_kernel": False})}
    if library.load() is not None:
        made["int8"] = (ortinf.export(root / "hf", root / "int8", kv_dtype="int8", progress=False, quality_gate="record"), root / "int8",
                        {"cpu_kernel": True})
    return made


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return packages(tmp_path_factory)


@pytest.mark.parametrize("kind", ["fp32", "fp16", "int8"])
def test_a_restart_restores_the_prompt_and_the_tokens_equal(kind, exported, tmp_path):
    if kind not in exported:
        pytest.skip("the kernel library is not built (python -m ortinf.kernels.build): no int8 pool")
    _, package, options = exported[kind]
    expected, cached = run(make_engine(package, **options))
    assert cached == 0
    first = make_engine(package, prefix_cache_dir=str(tmp_path), **options)
    assert run(first) == (expected, 0)
    first.kv_cache.store.flush()
    assert first.kv_cache.store.num_written == 6 and len(list(tmp_path.rglob("*.kv"))) == 6
    dtype = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8}[kind]
    assert first.graph.pool.arrays[0].dtype == dtype
    restarted = make_engine(package, prefix_cache_dir=str(tmp_path), **options)
    tokens, cached = run(restarted)
    assert tokens == expected and cached == 96 and restarted.kv_cache.store.num_restored == 6
    tokens, cached = run(restarted, PROMPT[:40] + [7] * 30)  # a shorter shared prefix: 2 blocks from memory now
    assert cached == 32


def test_bad_files_are_ignored_with_a_warning(exported, tmp_path, caplog):
    _, package, options = exported["fp32"]
    expected, _ = run(make_engine(package, **options))
    first = make_engine(package, prefix_cache_dir=str(tmp_path), **options)
    run(first)
    first.kv_cache.store.flush()
    restarted = make_engine(package, prefix_cache_dir=str(tmp_path), **options)
    keys = restarted.kv_cache._disk_keys(_request(PROMPT), 6)
    files = [restarted.kv_cache.store._path(key) for key in keys]
    files[3].write_bytes(files[3].read_bytes()[:1000])  # truncated (a crash mid-copy, a full disk)
    data = bytearray(files[1].read_bytes())
    data[-7] ^= 0xFF  # one byte flipped
    files[1].write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="ortinf.runtime.worker.prefix_store"):
        tokens, cached = run(restarted)
    assert tokens == expected and cached == 16  # block 0 restored; block 1 is corrupt: the rest is computed
    assert "checksum" in caplog.text  # (the corrupt file was deleted; the block, computed again, is written again)
    restarted.kv_cache.store.flush()  # block 1, computed again, is stored again
    again = make_engine(package, prefix_cache_dir=str(tmp_path), **options)
    assert run(again) == (expected, 48)  # blocks 0-2; block 3 is truncated
    assert "truncated" in caplog.text
    again.kv_cache.store.flush()
    assert run(make_engine(package, prefix_cache_dir=str(tmp_path), **options)) == (expected, 96)


def test_the_budget_and_the_options(exported, tmp_path):
    _, package, options = exported["fp32"]
    size = make_engine(package, prefix_cache_dir=str(tmp_path), **options).kv_cache.store.block_nbytes
    engine = make_engine(package, prefix_cache_dir=str(tmp_path / "small"), prefix_cache_disk=3 * size + 100, **options)
    run(engine)
    engine.kv_cache.store.flush()
    assert len(list((tmp_path / "small").rglob("*.kv"))) == 3  # the budget holds three blocks: the oldest went
    with pytest.raises(ConfigError, match="drop --no-enable-prefix-caching"):
        make_engine(package, prefix_cache_dir=str(tmp_path), enable_prefix_caching=False, **options)
    with pytest.raises(ConfigError, match="size"):
        make_engine(package, prefix_cache_dir=str(tmp_path), prefix_cache_disk="lots", **options)


def _request(prompt):  # noqa: ANN001, ANN202
    from ortinf.runtime.core.request import Request

    return Request("probe", list(prompt), GREEDY)
