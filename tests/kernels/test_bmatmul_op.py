"""ortinf.BMatMul (ortinf/kernels/cpu/bmatmul.cc over panel_gemm*): fp32 activations times bf16 weights, in a
one-node ONNX graph under the pinned onnxruntime. Under fp32 math, against float64 numpy on the same bf16 values;
under bf16 math (the default: vdpbf16ps on AVX512_BF16, the widening path elsewhere), against float64 numpy on the
activations rounded to bf16 as PyTorch rounds them. K and N not multiples of the 16-column panel, odd K, one row and
many, leading batch axes; a row's result bit for bit the same alone or beside others; both maths in one process;
errors for a weight that is not a constant bf16 [K, N] and for an unknown math; and every narrower build the machine
can run (ORTINF_KERNEL_ISA), the bf16 dot products only where the CPU has them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from builds import rerun_under
from onnx import TensorProto, helper, numpy_helper

from ortinf.kernels import library

pytestmark = pytest.mark.skipif(library.load() is None, reason="the kernel library is not built (python -m ortinf.kernels.build)")


def bf16_weight(rng: np.random.Generator, k: int, n: int) -> np.ndarray:
    return rng.standard_normal((k, n)).astype(np.float32).astype(ml_dtypes.bfloat16)


def op_model(w: np.ndarray, rank: int = 2, weight_input: bool = False, k: int | None = None, n: int | None = None) -> bytes:
    k, n = k or w.shape[0], n or w.shape[1]
    lead = [f"d{i}" for i in range(rank - 1)]
    node = helper.make_node("BMatMul", ["a", "w"], ["y"], domain="ortinf", K=k, N=n)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [*lead, k])]
    if weight_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.BFLOAT16, list(w.shape)))
    graph = helper.make_graph([node], "op", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])],
                              [] if weight_input else [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
    return model.SerializeToString()


def session(model: bytes, threads: int = 2, bf16_math: str = "fp32") -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    library.register(options, bf16_math)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("k,n,m", [(64, 16, 1), (200, 33, 7), (96, 130, 64 + 5), (1, 5, 3), (300, 1, 2)])
def test_matches_float64_on_the_bf16_values(k, n, m):
    rng = np.random.default_rng(k * n + m)
    w = bf16_weight(rng, k, n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    got = session(op_model(w)).run(None, {"a": a})[0]
    want = a.astype(np.float64) @ w.astype(np.float64)
    worst = np.abs(got - want).max() / np.abs(want).max()
    print(f"K={k} N={n} M={m}: worst relative error {worst:.2e}")
    assert got.shape == (m, n) and worst < 1e-5


@pytest.mark.parametrize("k,n,m", [(64, 16, 1), (200, 33, 7), (96, 130, 69), (1536, 256, 64), (2, 5, 3), (33, 20, 9)])
def test_bf16_math_equals_float64_on_the_rounded_activations(k, n, m):
    """bf16 math: the activations rounded to bf16 (to nearest even, as torch's cast), exact products summed in fp32;
    an odd K (no pairs for vdpbf16ps) rounds the same way on the widening path."""
    rng = np.random.default_rng(k * n + m)
    w = bf16_weight(rng, k, n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    a[0, 0] = 1 + 2**-8  # a tie: to even, 1.0
    got = session(op_model(w), bf16_math="bf16").run(None, {"a": a})[0]
    want = a.astype(ml_dtypes.bfloat16).astype(np.float64) @ w.astype(np.float64)
    scale = np.abs(want).max()
    worst, unrounded = np.abs(got - want).max() / scale, np.abs(got - a.astype(np.float64) @ w.astype(np.float64)).max() / scale
    print(f"K={k} N={n} M={m} ({library.panel_gemm_isa()}): {worst:.2e} from the rounded, {unrounded:.2e} from the unrounded")
    assert worst < 1e-5 and unrounded > 1e-4  # the activations were rounded, and nothing else differs
    alone = session(op_model(w), bf16_math="bf16").run(None, {"a": a[-1:]})[0]
    assert np.array_equal(alone[0], got[-1]), "a row's result depends on the rows beside it"


def test_both_maths_run_in_one_process_and_an_unknown_one_is_refused():
    """The arithmetic is the session's (its config entry), not the process's: an export verifies at fp32 math in the
    process that serves at bf16 math."""
    rng = np.random.default_rng(11)
    w = bf16_weight(rng, 128, 48)
    a = rng.standard_normal((5, 128)).astype(np.float32)
    bf16, fp32 = session(op_model(w), bf16_math="bf16"), session(op_model(w), bf16_math="fp32")
    exact = a.astype(np.float64) @ w.astype(np.float64)
    assert np.abs(fp32.run(None, {"a": a})[0] - exact).max() < 1e-4 < np.abs(bf16.run(None, {"a": a})[0] - exact).max()
    options = ort.SessionOptions()
    options.add_session_config_entry("ortinf.bf16_math", "fp16")
    with pytest.raises(Exception, match="ortinf.bf16_math must be bf16 or fp32"):
        options.register_custom_ops_library(str(library.load().path))
    with pytest.raises(ValueError, match="bf16_math must be one of bf16, fp32"):
        library.register(ort.SessionOptions(), "fp16")


@pytest.mark.parametrize("rows", [2, 3, 5, 9])
@pytest.mark.parametrize("bf16_math", ["fp32", "bf16"])
def test_rows_are_independent_and_axes_are_kept(rows, bf16_math):
    """Each row's result, bit for bit, as the row alone gives it: in the blocks of many rows, and in the few-row
    blocks a decode step takes (2, 3 rows side by side against several panels; 5 on AVX2)."""
    rng = np.random.default_rng(3)
    w = bf16_weight(rng, 160, 70)
    one = session(op_model(w, rank=3), threads=1, bf16_math=bf16_math)
    many = session(op_model(w, rank=3), threads=2, bf16_math=bf16_math)
    a = rng.standard_normal((2, rows, 160)).astype(np.float32)
    together = many.run(None, {"a": a})[0]
    assert together.shape == (2, rows, 70)
    alone = np.stack([np.concatenate([one.run(None, {"a": a[b:b + 1, i:i + 1]})[0][0] for i in range(rows)]) for b in range(2)])
    assert np.array_equal(together, alone)
    assert np.array_equal(many.run(None, {"a": a[:1]})[0][0], together[0])  # the rows of one batch: a few-row call
    assert many.run(None, {"a": np.zeros((1, 0, 160), np.float32)})[0].shape == (1, 0, 70)


def test_bad_weights_are_errors_not_crashes():
    w = bf16_weight(np.random.default_rng(5), 64, 20)
    with pytest.raises(Exception, match="must be a constant initializer"):
        session(op_model(w, weight_input=True))
    with pytest.raises(Exception, match=r"bfloat16 \[K, N\] = \[64, 21\]"):
        session(op_model(w, n=21))
    with pytest.raises(Exception, match="K = 64|dimension|shape|Got invalid"):
        session(op_model(w)).run(None, {"a": np.zeros((2, 63), np.float32)})


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
def test_every_build_the_machine_runs(isa):
    """The op tests again under each narrower build this CPU can run (ORTINF_KERNEL_ISA caps the pick): avx512 is
    AVX-512 without the bf16 dot products, which the pick takes only where the CPU has AVX512_BF16."""
    narrower = {"avx512bf16": ["avx512", "avx2", "generic"], "avx512": ["avx2", "generic"], "avx2": ["generic"], "generic": []}
    best = library.panel_gemm_isa()
    if isa not in narrower.get(best, []):
        pytest.skip(f"this CPU's best build is {best}: {isa} is not a narrower one it runs")
    rerun_under(isa, __file__, "library.panel_gemm_isa()")
