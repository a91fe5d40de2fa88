"""An fp16 KV cache under fp32 or int8 weights (`ortinf export --kv-dtype fp16`; int8's default): half the pool's
bytes, logits within the fp16 tolerance of PyTorch, and a paged engine whose greedy tokens do not
depend on how it was scheduled."""

from __future__ import annotations

import numpy as np
import pytest

import ortinf
from engine_helpers import assert_scheduling_exact
from ortinf.errors import ExportError
from ortinf.runtime.kv_pool import block_bytes
from tiny_models import build_decoder


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_fp16_kv_cache_export_and_engine(dtype, tmp_path):
    build_decoder("llama", tmp_path / "hf")
    # accuracy level 0: level 4's kernels differ with the batch's row count (see exporter/quantize.py),
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


def test_kv_dtype_refusals(tmp_path):
    build_decoder("llama", tmp_path / "hf")
    with pytest.raises(ExportError, match="unknown KV cache dtype 'int8'"):
        ortinf.export(tmp_path / "hf", tmp_path / "a", kv_dtype="int8", progress=False)
    with pytest.raises(ExportError, match="an fp32 KV cache under fp16 weights gains nothing"):
        ortinf.export(tmp_path / "hf", tmp_path / "b", dtype="fp16", kv_dtype="fp32", progress=False)
