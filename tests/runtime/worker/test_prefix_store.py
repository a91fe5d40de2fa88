"""The prefix cache on disk (--prefix-cache-dir, ortinf/runtime/worker/prefix_store.py): a new engine (a restart)
restores a long prompt's blocks instead of prefilling them, for every pool dtype (fp32, fp16, the CPU kernel's int8
rows), and its tokens equal those of an engine that computed everything, whatever the new pool's size; a truncated or
corrupted file is ignored with a warning; the whole folder, every package's blocks, stays within its budget, a stale
package's go first; a FIFO is a miss, not a hang; a disk that fails writes or cannot be written leaves no temporary files
and costs one warning; two engines on one folder see each other's blocks."""

from __future__ import annotations

import logging
import os
import threading

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


def run(engine, prompt=PROMPT):
    request_id = engine.add_request(prompt, GREEDY)
    output = drain(engine, [request_id])[request_id]
    return output.outputs[0].token_ids, output.num_cached_tokens


def packages(tmp_path_factory) -> dict[str, tuple]:
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


def test_the_pool_size_is_not_in_the_identity(exported, tmp_path):
    _, package, options = exported["fp32"]
    expected, _ = run(make_engine(package, **options))
    first = make_engine(package, prefix_cache_dir=str(tmp_path), num_blocks=512, **options)
    run(first)
    first.kv_cache.store.flush()
    restarted = make_engine(package, prefix_cache_dir=str(tmp_path), num_blocks=100, **options)  # another --kv-cache-memory
    assert restarted.kv_cache.store.identity == first.kv_cache.store.identity
    assert run(restarted) == (expected, 96)
    assert restarted.stats().prefix_disk_restored == 6 and restarted.stats().prefix_disk_bytes == 6 * first.kv_cache.store.file_nbytes


def test_two_engines_on_one_folder_see_each_others_blocks(exported, tmp_path):
    _, package, options = exported["fp32"]
    one = make_engine(package, prefix_cache_dir=str(tmp_path), **options)
    two = make_engine(package, prefix_cache_dir=str(tmp_path), **options)  # started before `one` wrote anything
    expected, _ = run(one)
    one.kv_cache.store.flush()
    assert run(two) == (expected, 96)


def test_the_budget_bounds_the_whole_folder_and_a_stale_package_goes_first(exported, tmp_path):
    _, package, options = exported["fp32"]
    old = make_engine(package, prefix_cache_dir=str(tmp_path), **options)
    run(old)
    old.kv_cache.store.flush()
    stale = tmp_path / old.kv_cache.store.identity
    assert len(list(stale.rglob("*.kv"))) == 6
    (tmp_path / "empty").mkdir()  # not the store's: never read or removed, whatever their names and ages
    (tmp_path / "notes" / "ab").mkdir(parents=True)
    (tmp_path / "notes" / "ab" / "draft.tmp").write_text("mine")
    os.utime(tmp_path / "notes" / "ab" / "draft.tmp", (1, 1))
    # block size 32: another identity (as a re-exported package's), blocks twice the size; the budget holds two of them
    probe = make_engine(package, prefix_cache_dir=str(tmp_path / "probe"), block_size=32, **options).kv_cache.store
    limit = 2 * probe.file_nbytes + 100
    new = make_engine(package, prefix_cache_dir=str(tmp_path), block_size=32, prefix_cache_disk=limit, **options)
    new.kv_cache.store.flush()  # the start alone shrinks the folder to the budget: the stale blocks, oldest first
    assert sum(p.stat().st_size for p in tmp_path.glob("*/*/*.kv")) <= limit and 0 < len(list(stale.rglob("*.kv"))) < 6
    run(new)  # 3 full blocks of 32: each written one evicts
    new.kv_cache.store.flush()
    assert not stale.exists()  # the stale identity's last block went, and its folder with it
    assert sum(p.stat().st_size for p in tmp_path.glob("*/*/*.kv")) <= limit
    assert len(list((tmp_path / new.kv_cache.store.identity).rglob("*.kv"))) == 2 and new.stats().prefix_disk_evicted == 6 + 1
    assert (tmp_path / "empty").is_dir() and (tmp_path / "notes" / "ab" / "draft.tmp").read_text() == "mine"


def test_a_fifo_in_place_of_a_block_is_a_miss_not_a_hang(exported, tmp_path):
    _, package, options = exported["fp32"]
    expected, _ = run(make_engine(package, **options))
    first = make_engine(package, prefix_cache_dir=str(tmp_path), **options)
    run(first)
    first.kv_cache.store.flush()
    restarted = make_engine(package, prefix_cache_dir=str(tmp_path), **options)  # it indexed the block as a regular file
    files = [restarted.kv_cache.store._path(key) for key in restarted.kv_cache._disk_keys(_request(PROMPT), 6)]
    files[2].unlink()
    os.mkfifo(files[2])  # a plain open() would wait for a writer forever, the engine with it
    result = []
    worker = threading.Thread(target=lambda: result.append(run(restarted)), daemon=True)
    worker.start()
    worker.join(30)
    assert result == [(expected, 32)]
    restarted.kv_cache.store.flush()
    assert files[2].is_file()  # the block, computed again, was written over the FIFO
    os.mkfifo(files[2].with_name("0" * 64 + ".tmp1-1"))  # FIFOs that are not blocks: a new engine's scan skips them
    os.mkfifo(files[2].with_name("0" * 64 + ".kv"))
    assert run(make_engine(package, prefix_cache_dir=str(tmp_path), **options)) == (expected, 96)


def test_failed_writes_leave_no_temporary_files_and_one_warning(exported, tmp_path, caplog):
    _, package, options = exported["fp32"]
    expected, _ = run(make_engine(package, **options))
    engine = make_engine(package, prefix_cache_dir=str(tmp_path), **options)
    for key in engine.kv_cache._disk_keys(_request(PROMPT), 6):  # a directory where each block goes: every rename fails
        engine.kv_cache.store._path(key).mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="ortinf.runtime.worker.prefix_store"):
        assert run(engine) == (expected, 0)
        engine.kv_cache.store.flush()
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name] and engine.kv_cache.store.num_written == 0
    assert len(caplog.records) == 1, caplog.text  # six failures, one warning (rate-limited)
    assert run(make_engine(package, prefix_cache_dir=str(tmp_path), **options)) == (expected, 0)  # directories are misses


def test_a_folder_that_cannot_be_created_or_written_is_a_miss(exported, tmp_path, caplog):
    _, package, options = exported["fp32"]
    expected, _ = run(make_engine(package, **options))
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING, logger="ortinf.runtime.worker.prefix_store"):
        engine = make_engine(package, prefix_cache_dir=str(tmp_path / "file" / "kv"), **options)  # mkdir fails: it starts
        assert run(engine) == (expected, 0)
        engine.kv_cache.store.flush()
    assert "cannot create" in caplog.text
    if os.geteuid() == 0:
        pytest.skip("root: chmod does not make a folder read-only")
    first = make_engine(package, prefix_cache_dir=str(tmp_path / "ro"), **options)
    run(first)
    first.kv_cache.store.flush()
    identity = tmp_path / "ro" / first.kv_cache.store.identity
    stray = next(identity.glob("*/*.kv")).with_name("0" * 64 + ".tmp1-1")
    stray.write_bytes(b"")
    os.utime(stray, (1, 1))  # an old temporary file: the start removes it, or tries
    for folder in [tmp_path / "ro", identity, *identity.iterdir()]:
        folder.chmod(0o555)
    try:
        restarted = make_engine(package, prefix_cache_dir=str(tmp_path / "ro"), prefix_cache_disk=100, **options)
        assert run(restarted) == (expected, 96)  # reads work; eviction and writes fail quietly
        assert run(restarted, PROMPT[:40] + [9] * 60)[1] == 32
        restarted.kv_cache.store.flush()
    finally:
        for folder in [tmp_path / "ro", identity, *identity.iterdir()]:
            folder.chmod(0o755)


def _request(prompt):
    from ortinf.runtime.core.request import Request

    return Request("probe", list(prompt), GREEDY)
