"""ortinf.BMatMul on bf16 dot products (panel_gemm_avx512bf16.cc, ORTINF_BF16_MATH=bf16 on a CPU with AVX512_BF16):
the activations rounded to bf16 (round to nearest even, as PyTorch's float -> bfloat16) times the bf16 weights, with
fp32 sums, against float64 numpy on those same rounded values; an odd K keeps the widening path (fp32 arithmetic on
the unrounded activations); a row's result bit for bit the same alone or beside others. Run in a child process: the
build is picked once per process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ortinf.kernels import library

CHILD = r"""
import sys
import ml_dtypes, numpy as np
sys.path.insert(0, sys.argv[1])
from test_bmatmul_op import bf16_weight, op_model, session
from ortinf.kernels import library

assert library.panel_gemm_isa() == "avx512bf16", library.panel_gemm_isa()
for k, n, m in [(64, 16, 1), (200, 33, 7), (96, 130, 69), (1536, 256, 64), (2, 5, 3)]:
    rng = np.random.default_rng(k * n + m)
    w = bf16_weight(rng, k, n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    got = session(op_model(w)).run(None, {"a": a})[0]
    rounded = a.astype(ml_dtypes.bfloat16).astype(np.float64)
    want = rounded @ w.astype(np.float64)
    worst = np.abs(got - want).max() / np.abs(want).max()
    unrounded = np.abs(got - a.astype(np.float64) @ w.astype(np.float64)).max() / np.abs(want).max()
    print(f"K={k} N={n} M={m}: {worst:.2e} against the rounded activations, {unrounded:.2e} against the unrounded")
    assert worst < 1e-5 and unrounded > 1e-4, (k, n, m)  # the activations were rounded, and nothing else differs
    alone = session(op_model(w)).run(None, {"a": a[-1:]})[0]
    assert np.array_equal(alone[0], got[-1]), "a row's result depends on the rows beside it"
rng = np.random.default_rng(5)
w = bf16_weight(rng, 33, 20)
a = rng.standard_normal((9, 33)).astype(np.float32)
got = session(op_model(w)).run(None, {"a": a})[0]
assert np.abs(got - a.astype(np.float64) @ w.astype(np.float64)).max() < 1e-4  # odd K: the widening path, unrounded
print("ok")
"""


@pytest.mark.skipif(library.load() is None, reason="the kernel library is not built (python -m ortinf.kernels.build)")
def test_bf16_dot_products_equal_float64_on_rounded_activations(monkeypatch):
    flags = open("/proc/cpuinfo").read() if sys.platform == "linux" else ""
    if " avx512_bf16" not in flags:
        pytest.skip("this CPU has no AVX512_BF16")
    from pathlib import Path

    env = {"ORTINF_BF16_MATH": "bf16"}
    import os

    done = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    print(done.stdout)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-2000:]


def test_an_export_under_bf16_math_is_refused_in_one_line(tmp_path):
    """The export verifies fp32 arithmetic with the kernels of its own process: under ORTINF_BF16_MATH=bf16 it would
    fail its verification (0.02 vs 1e-4) with a message about tolerances; it says what to change instead."""
    from support.cli_helpers import ortinf_in_process

    (tmp_path / "hf").mkdir()  # a folder with a config: the refusal comes before the model is read
    (tmp_path / "hf" / "config.json").write_text("{\"model_type\": \"llama\"}")
    done = ortinf_in_process("export", tmp_path / "hf", "-o", tmp_path / "pkg", env={"ORTINF_BF16_MATH": "bf16"})
    assert done.returncode != 0 and "unset it for the export" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "pkg").exists()
