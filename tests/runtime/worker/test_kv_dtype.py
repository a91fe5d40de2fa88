"""An fp16 KV cache under fp32 or int8 weights (`ortinf export --kv-dtype fp16`; int8's default): half the pool's
bytes, logits within the fp16 tolerance of PyTorch, and a paged engine whose greedy tokens do not
depend on how it was scheduled. An int8 KV cache (`--kv-dtype int8`, the CPU kernel graph's pool):
a quarter of fp32's bytes (plus a scale per row), its quality gated, and scheduling-exact too."""

from __future__ import annotations

import numpy as np
import pytest
from support.engine_helpers import assert_scheduling_exact, make_engine
from support.tiny_models import build_decoder

import ortinf
from ortinf.errors import ExportError
from ortinf.kernels import library
from ortinf.runtime.worker.decoder_graph import pool_spec
from ortinf.runtime.worker.kv_pool import block_bytes


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_fp16_kv_cache_export_and_engine(dtype, tmp_path):
    build_decoder("llama", tmp_path / "hf")
    # accuracy level 0: level 4's kernels differ with the batch's row count (see ortinf/exporter/quantize.py),
    # so only level 0 makes scheduling-independent tokens a property to test
    options = {"accuracy_level": 0} if dtype == "int8" else {}
    manifest = ortinf.export(tmp_path / "hf", tmp_path / "pkg", dtype=dtype, kv_dtype="fp16", progress=False, **options)
    full = ortinf.export(tmp_path / "hf", tmp_path / "full", dtype=dtype, kv_dtype="fp32", progress=False, **options)
    assert manifest.dtype == dtype and manifest.decoder.kv_dtype == "fp16" and full.decoder.kv_dtype == "fp32"
    assert block_bytes(manifest.decoder, 16) * 2 == block_bytes(full.decoder, 16)
    if dtype == "fp32":
        assert 0 < manifest.parity.max_abs_diff <= 5e-2 and manifest.parity.tolerance == 5e-2
    else:
        assert not manifest.quality.failures()
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 256, n).tolist() for n in (7, 50, 120, 160)]
    prompts.append(prompts[2][:96] + [9, 9])  # a prefix hit
    assert_scheduling_exact(tmp_path / "pkg", prompts)


@pytest.mark.skipif(library.load() is None, reason="the kernel library is not built (python -m ortinf.kernels.build)")
@pytest.mark.parametrize("dtype", ["fp32", "int4"])
def test_int8_kv_cache_export_and_engine(dtype, tmp_path):
    build_decoder("llama", tmp_path / "hf")
    manifest = ortinf.export(tmp_path / "hf", tmp_path / "pkg", dtype=dtype, kv_dtype="int8", progress=False,
                             quality_gate="record")
    portable = "fp32" if dtype == "fp32" else "fp16"  # the other providers' graph keeps auto's pool
    assert manifest.decoder.kv_dtype == portable and manifest.cpu_kernel.kv_dtype == "int8"
    if dtype == "fp32":  # gated by quality (as int8 weights are); the portable graph is still exact
        assert manifest.parity.max_abs_diff <= 1e-3 and 0 < manifest.cpu_kernel.max_abs_diff < 0.5
        assert manifest.quality.enforced and not manifest.quality.failures()
    spec = manifest.decoder
    row = 2 * spec.num_layers * spec.num_kv_heads
    assert block_bytes(pool_spec(manifest, library.load()), 16) == row * 16 * (spec.head_dim + 4)
    engine = make_engine(tmp_path / "pkg", num_blocks=32)
    assert engine.graph.pool.arrays[0].dtype == np.int8 and "PagedAttention" in engine.graph.kernel_description
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 256, n).tolist() for n in (7, 50, 120, 160)]
    prompts.append(prompts[2][:96] + [9, 9])  # a prefix hit
    assert_scheduling_exact(tmp_path / "pkg", prompts)


def test_kv_dtype_refusals(tmp_path):
    build_decoder("llama", tmp_path / "hf")
    with pytest.raises(ExportError, match="unknown KV cache dtype 'int9'"):
        ortinf.export(tmp_path / "hf", tmp_path / "a", kv_dtype="int9", progress=False)
    with pytest.raises(ExportError, match="--kv-dtype int8 is read by ortinf's CPU kernel graph only"):
        ortinf.export(tmp_path / "hf", tmp_path / "a", kv_dtype="int8", cpu_kernel=False, progress=False)
    with pytest.raises(ExportError, match="computes in fp32: not at --dtype fp16"):
        ortinf.export(tmp_path / "hf", tmp_path / "a", dtype="fp16", kv_dtype="int8", progress=False)
    with pytest.raises(ExportError, match="an fp32 KV cache under fp16 weights gains nothing"):
        ortinf.export(tmp_path / "hf", tmp_path / "b", dtype="fp16", kv_dtype="fp32", progress=False)
