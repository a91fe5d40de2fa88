"""ortinf.MoE (ortinf/kernels/cpu/moe.cc) against a numpy reference in a one-node graph: softmax/top-k routing
with ties to the lower expert index and renormalisation, both activations (SiLU-gated with [gate | up]
columns, gpt-oss's clamped interleaved form with biases), fp32 and int8/int4 experts packed as
QMatMul packs them, experts no token chose, a token's result independent of the batch and threads,
the single job list against the per-expert computation for k from 1 to E and 1-70 tokens, and clear errors for
bad inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builds import rerun_under
from onnx import TensorProto, helper, numpy_helper

from ortinf.exporter.quantize import qmatmul_tensors, quantize_weight
from ortinf.kernels import library

pytestmark = pytest.mark.skipif(library.load() is None, reason="the kernel library is not built (python -m ortinf.kernels.build)")


def experts(rng, E, H, I, biases):
    gate_up = rng.normal(0, H**-0.5, (E, H, 2 * I)).astype(np.float32)
    down = rng.normal(0, I**-0.5, (E, I, H)).astype(np.float32)
    gate_up_bias = rng.normal(0, 0.1, (E, 2 * I)).astype(np.float32) if biases else None
    down_bias = rng.normal(0, 0.1, (E, H)).astype(np.float32) if biases else None
    return gate_up, down, gate_up_bias, down_bias


def session(gate_up, down, gate_up_bias, down_bias, top_k, normalize, activation, bits=0, block=32, threads=2,
            alpha=1.702, limit=7.0):
    E, H, N1 = gate_up.shape
    I = N1 // 2
    inits, names = [], ["hidden", "logits"]
    for name, w in (("gate_up", gate_up), ("down", down)):
        if bits:
            packed = [qmatmul_tensors(quantize_weight(w[e], bits, block)) for e in range(E)]
            inits += [numpy_helper.from_array(np.stack([p for p, _ in packed]), name),
                      numpy_helper.from_array(np.stack([s for _, s in packed]), name + ".scales")]
        else:  # panels of 16 columns (ortinf/kernels/cpu/moe_impl.h)
            panels = np.pad(w, ((0, 0), (0, 0), (0, -w.shape[2] % 16))).reshape(E, w.shape[1], -1, 16).transpose(0, 2, 1, 3)
            inits += [numpy_helper.from_array(np.ascontiguousarray(panels), name),
                      numpy_helper.from_array(np.zeros(0, np.float32), name + ".scales")]
        names += [name, name + ".scales"]
    for name, b in (("gate_up_bias", gate_up_bias), ("down_bias", down_bias)):
        if b is not None:
            inits.append(numpy_helper.from_array(b, name))
        names.append(name if b is not None else "")
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MoE", names, ["out"], domain="ortinf", top_k=top_k, normalize=int(normalize), activation=activation,
                            bits=bits, block_size=block, hidden_size=H, intermediate_size=I, alpha=alpha, limit=limit)
    graph = helper.make_graph([node], "moe", [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [None, H]),
                                              helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, None])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def reference(hidden, logits, gate_up, down, gate_up_bias, down_bias, top_k, normalize, activation, alpha=1.702, limit=7.0):
    """float64, with the routing of ortinf/exporter/moe.py (stable sort: ties to the lower index)."""
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    out = np.zeros(hidden.shape, np.float64)
    for t in range(len(hidden)):
        ids = np.argsort(-probs[t], kind="stable")[:top_k]
        w = probs[t, ids] / (probs[t, ids].sum() if normalize else 1.0)
        for e, weight in zip(ids, w):
            y = hidden[t].astype(np.float64) @ gate_up[e] + (0 if gate_up_bias is None else gate_up_bias[e])
            if activation == 0:
                gate, up = np.split(y, 2)
                act = gate / (1 + np.exp(-gate)) * up
            else:
                gate, up = np.minimum(y[0::2], limit), np.clip(y[1::2], -limit, limit)
                act = (up + 1) * gate / (1 + np.exp(-gate * alpha))
            out[t] += weight * (act @ down[e] + (0 if down_bias is None else down_bias[e]))
    return out


@pytest.mark.parametrize("activation,biases,normalize", [(0, False, True), (0, False, False), (1, True, True)],
                         ids=["silu, renormalised (Mixtral, Qwen3-MoE)", "silu, raw weights (Qwen2-MoE)", "gpt-oss"])
@pytest.mark.parametrize("tokens", [1, 5, 70])
def test_fp32_experts_match_numpy(activation, biases, normalize, tokens):
    rng = np.random.default_rng(tokens + 10 * activation)
    E, H, I, k = 8, 90, 36, 2  # 72 and 90 columns: both GEMMs end in a part-filled panel of 16
    weights = experts(rng, E, H, I, biases)
    hidden = rng.standard_normal((tokens, H)).astype(np.float32)
    logits = rng.standard_normal((tokens, E)).astype(np.float32)
    got = session(*weights, k, normalize, activation).run(None, {"hidden": hidden, "logits": logits})[0]
    want = reference(hidden, logits, *weights, k, normalize, activation)
    assert got.shape == (tokens, H) and np.abs(got - want).max() < 1e-4


def test_ties_go_to_the_lower_expert_and_unchosen_experts_cost_nothing():
    rng = np.random.default_rng(3)
    E, H, I = 8, 64, 32
    weights = experts(rng, E, H, I, False)
    hidden = rng.standard_normal((4, H)).astype(np.float32)
    logits = np.zeros((4, E), np.float32)
    logits[:, [5, 6, 2]] = 1.0  # a three-way tie for two places: experts 2 and 5
    got = session(*weights, 2, True, 0).run(None, {"hidden": hidden, "logits": logits})[0]
    want = reference(hidden, logits, *weights, 2, True, 0)
    assert np.abs(got - want).max() < 1e-4
    only = [w.copy() for w in weights[:2]]
    for w in only:
        w[[0, 1, 3, 4, 6, 7]] = np.nan  # experts no token chose are never read
    assert np.array_equal(session(*only, None, None, 2, True, 0).run(None, {"hidden": hidden, "logits": logits})[0], got)


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_experts(bits):
    """Packed per expert as QMatMul packs a weight: the result is the dequantized experts' within the
    activations' per-token rounding; a token's row does not depend on the batch or the thread count."""
    rng = np.random.default_rng(bits)
    E, H, I = 8, 128, 64
    weights = list(experts(rng, E, H, I, True))
    hidden = rng.standard_normal((33, H)).astype(np.float32)
    logits = rng.standard_normal((33, E)).astype(np.float32)
    moe = session(*weights, 2, True, 1, bits=bits, block=32)
    got = moe.run(None, {"hidden": hidden, "logits": logits})[0]
    dequantized = [np.stack([quantize_weight(w[e], bits, 32).dequantized() for e in range(E)]) for w in weights[:2]]
    want = reference(hidden, logits, *dequantized, *weights[2:], 2, True, 1)
    error = np.abs(got - want).max() / np.abs(want).max()
    print(f"int{bits} experts: max error {error:.2e} of the largest output (the activations' rounding)")
    assert error < 0.03  # measured 0.015 (int8) and 0.012 (int4): exact integer sums, the same on every build
    alone = moe.run(None, {"hidden": hidden[7:8], "logits": logits[7:8]})[0]
    one_thread = session(*weights, 2, True, 1, bits=bits, block=32, threads=1).run(None, {"hidden": hidden, "logits": logits})[0]
    assert np.array_equal(alone[0], got[7]) and np.array_equal(one_thread, got)


def test_fp32_rows_do_not_depend_on_the_batch():
    rng = np.random.default_rng(5)
    weights = experts(rng, 4, 64, 48, False)
    hidden = rng.standard_normal((9, 64)).astype(np.float32)
    logits = rng.standard_normal((9, 4)).astype(np.float32)
    moe = session(*weights, 2, True, 0)
    batch = moe.run(None, {"hidden": hidden, "logits": logits})[0]
    for t in (0, 4, 8):
        assert np.array_equal(moe.run(None, {"hidden": hidden[t:t + 1], "logits": logits[t:t + 1]})[0][0], batch[t])


@pytest.mark.parametrize("bits", [0, 8, 4], ids=["fp32", "int8", "int4"])
@pytest.mark.parametrize("tokens", [1, 3, 32, 70])
@pytest.mark.parametrize("E,k", [(8, 1), (8, 2), (6, 4), (4, 4)], ids=["k1", "k2", "k4", "k=E"])
def test_one_job_list_equals_the_per_expert_computation(bits, tokens, E, k):
    """The step's single job list (gather, every chosen expert's gate_up columns, every down; moe.cc) against each
    token's experts computed one by one (float64; quantized: the dequantized experts, within the activations'
    rounding), for k from 1 to E and 1-70 tokens (70 tokens x 4 of 4 experts: two row groups of 64 per expert);
    bit for bit the same on one thread as on two, and a token alone as in the batch."""
    rng = np.random.default_rng(100 * tokens + 10 * k + bits)
    H, I = 96, 48  # gate_up 96 columns, down 96: six panels/tiles each, a job of 64 columns and one of 32
    weights = list(experts(rng, E, H, I, bits == 0))
    hidden = rng.standard_normal((tokens, H)).astype(np.float32)
    logits = rng.standard_normal((tokens, E)).astype(np.float32)
    feeds = {"hidden": hidden, "logits": logits}
    moe = session(*weights, k, True, 0, bits=bits, block=32)
    got = moe.run(None, feeds)[0]
    if bits:
        dequantized = [np.stack([quantize_weight(w[e], bits, 32).dequantized() for e in range(E)]) for w in weights[:2]]
        want = reference(hidden, logits, *dequantized, *weights[2:], k, True, 0)
        assert np.abs(got - want).max() / np.abs(want).max() < 0.03
    else:
        want = reference(hidden, logits, *weights, k, True, 0)
        assert np.abs(got - want).max() < 1e-4
    one_thread = session(*weights, k, True, 0, bits=bits, block=32, threads=1).run(None, feeds)[0]
    assert np.array_equal(one_thread, got)
    last = tokens - 1
    alone = moe.run(None, {"hidden": hidden[last:], "logits": logits[last:]})[0]
    assert np.array_equal(alone[0], got[last])


def test_bad_inputs_are_errors():
    rng = np.random.default_rng(1)
    weights = experts(rng, 4, 64, 32, False)
    moe = session(*weights, 2, True, 0)
    with pytest.raises(Exception, match="router_logits must be float32"):
        moe.run(None, {"hidden": np.zeros((3, 64), np.float32), "logits": np.zeros((2, 4), np.float32)})
    with pytest.raises(Exception, match=r"gate_up must be float32 panels \[5, 4, 64, 16\]"):  # more experts than weights
        moe.run(None, {"hidden": np.zeros((3, 64), np.float32), "logits": np.zeros((3, 5), np.float32)})
    with pytest.raises(Exception, match="top_k, hidden_size"):
        session(*weights, 0, True, 0)


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_every_build_the_machine_runs(isa):
    if isa == "avx2" and "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX2")
    rerun_under(isa, __file__, "library.load().isa")
