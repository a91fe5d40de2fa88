"""ortinf.QMatMul (ortinf/kernels/cpu/qmatmul*) against a numpy reference of the same integer arithmetic, in
a one-node ONNX graph under the pinned onnxruntime: int8 and int4 weights packed by the exporter
(ortinf/exporter/quantize.py), block sizes 32-128, K not a multiple of the block, N not a multiple of the
16-column tile, ragged row counts, bias, leading batch axes; per-token scales (an outlier row changes
no other row, bit for bit); and every narrower build the machine can run (ORTINF_KERNEL_ISA)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builds import rerun_under
from onnx import TensorProto, helper, numpy_helper

from ortinf.exporter.quantize import Quantized, matmul_nbits_tensors, qmatmul_tensors, quantize_weight
from ortinf.kernels import library

pytestmark = pytest.mark.skipif(library.load() is None, reason="the kernel library is not built (python -m ortinf.kernels.build)")


def op_session(qw: Quantized, bias: np.ndarray | None = None, rank: int = 2, threads: int = 2,
               nbits_level: int | None = None, layout: int = 1) -> ort.InferenceSession:
    """One QMatMul node reading MatMulNBits' tensors (layout 1, what packages hold since issue 42) or its
    own packed form (layout 0, older packages); or, with nbits_level, ORT's MatMulNBits on the same numbers."""
    k, n = qw.k, qw.n
    if nbits_level is None:
        if layout == 1:
            packed, scales = matmul_nbits_tensors(qw)
            scales = scales.reshape(-1)
        else:
            packed, scales = qmatmul_tensors(qw)
        names = ["a", "w", "s"] + (["bias"] if bias is not None else [])
        node = helper.make_node("QMatMul", names, ["y"], domain="ortinf", K=k, N=n, bits=qw.bits, block_size=qw.block_size,
                                layout=layout)
        domain = "ortinf"
    else:
        packed, scales = matmul_nbits_tensors(qw)
        scales = scales.reshape(-1)
        node = helper.make_node("MatMulNBits", ["a", "w", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=qw.bits,
                                block_size=qw.block_size, accuracy_level=nbits_level)
        domain = "com.microsoft"
    initializers = [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(scales, "s")]
    if bias is not None:
        initializers.append(numpy_helper.from_array(bias, "bias"))
    lead = [f"d{i}" for i in range(rank - 1)]
    graph = helper.make_graph([node], "op", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [*lead, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def reference(a: np.ndarray, qw: Quantized) -> np.ndarray:
    """The op's arithmetic in float64: rows quantized per block (scale max|a| / 127, round half to
    even, float32 as the op computes it), exact integer sums, then both scales."""
    m, k = a.shape
    blocks = qw.q.shape[0] // qw.block_size
    padded = np.zeros((m, blocks * qw.block_size), np.float32)
    padded[:, :k] = a
    ab = padded.reshape(m, blocks, qw.block_size)
    amax = np.abs(ab).max(-1)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, np.float32(1)), np.float32(0)).astype(np.float32)
    xq = np.clip(np.rint(ab * inv[..., None]), -127, 127).astype(np.float64)
    sums = np.einsum("mbk,bkn->mbn", xq, qw.q.reshape(blocks, qw.block_size, -1).astype(np.float64))
    return np.einsum("mbn,mb,bn->mn", sums, (amax / np.float32(127)).astype(np.float64), qw.scales.astype(np.float64))


CASES = [  # bits, block, K, N, M
    (8, 128, 896, 200, 7), (8, 128, 200, 33, 1), (8, 32, 96, 40, 5), (8, 64, 130, 17, 9),
    (4, 32, 96, 40, 5), (4, 32, 200, 33, 13), (4, 64, 130, 16, 1), (4, 128, 256, 48, 4),
]


@pytest.mark.parametrize("bits,block,k,n,m", CASES)
def test_matches_the_integer_reference(bits, block, k, n, m):
    rng = np.random.default_rng(k * n + m)
    qw = quantize_weight(rng.standard_normal((k, n)).astype(np.float32), bits, block)
    a = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    got = op_session(qw, bias).run(None, {"a": a})[0]
    # the layout older packages store (packed at export) computes the same numbers, bit for bit
    assert np.array_equal(op_session(qw, bias, layout=0).run(None, {"a": a})[0], got)
    want = reference(a, qw) + bias
    worst = np.abs(got - want).max() / np.abs(want).max()
    print(f"int{bits} block {block} K={k} N={n} M={m}: worst relative error {worst:.2e}")
    assert got.shape == (m, n) and worst < 1e-5
    # and it is the dequantized weights' product up to the activations' rounding (~1/254 per block)
    dense = a @ qw.dequantized() + bias
    assert np.abs(got - dense).max() / np.abs(dense).max() < 0.03


def test_the_exporter_writes_one_set_of_numbers_for_both_graphs():
    """MatMulNBits (model.onnx) and QMatMul (model.cpu.onnx) read the same quantized weights."""
    rng = np.random.default_rng(3)
    for bits, block in ((8, 128), (4, 32)):
        qw = quantize_weight(rng.standard_normal((160, 24)).astype(np.float32), bits, block)
        a = rng.standard_normal((3, 160)).astype(np.float32)
        nbits = op_session(qw, nbits_level=0).run(None, {"a": a})[0]  # level 0: fp32 activations
        assert np.abs(nbits - a @ qw.dequantized()).max() < 1e-4


def test_weight_quantization_rules():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    q8 = quantize_weight(w, 8, 32)
    assert q8.q.min() >= -127 and q8.q.max() <= 127 and np.abs(q8.q).max() == 127
    q4 = quantize_weight(w, 4, 32)
    assert q4.q.min() == -8 and q4.q.max() <= 7  # each block's extreme lands on -8
    # rounding costs half a step; only a value opposite the extreme, clipped at +7, costs up to one
    assert np.abs(q4.dequantized() - w).max() <= np.abs(q4.scales).max() + 1e-6
    assert np.abs(q8.dequantized() - w).max() <= q8.scales.max() / 2 + 1e-6
    zero = quantize_weight(np.zeros((32, 3), np.float32), 4, 32)
    assert not zero.q.any() and not zero.scales.any()


def test_leading_axes_and_empty_rows():
    rng = np.random.default_rng(7)
    qw = quantize_weight(rng.standard_normal((64, 20)).astype(np.float32), 8, 32)
    session = op_session(qw, rank=3)
    a = rng.standard_normal((2, 3, 64)).astype(np.float32)
    got = session.run(None, {"a": a})[0]
    assert got.shape == (2, 3, 20)
    assert np.allclose(got.reshape(6, 20), reference(a.reshape(6, 64), qw), rtol=1e-5, atol=1e-5)
    assert session.run(None, {"a": np.zeros((1, 0, 64), np.float32)})[0].shape == (1, 0, 20)


@pytest.mark.parametrize("bits", [8, 4])
def test_an_outlier_token_changes_no_other_row(bits):
    """Per-token scales: a row's result is the same, bit for bit, alone or beside a row of huge
    activations, at any position in the call and with any number of rows around it (batch invariance)."""
    rng = np.random.default_rng(11)
    qw = quantize_weight(rng.standard_normal((256, 48)).astype(np.float32), bits, 32 if bits == 4 else 128)
    session = op_session(qw)
    rows = rng.standard_normal((9, 256)).astype(np.float32)
    alone = np.concatenate([session.run(None, {"a": rows[i:i + 1]})[0] for i in range(9)])
    outlier = rng.standard_normal((1, 256)).astype(np.float32) * 1e4
    mixed = session.run(None, {"a": np.concatenate([rows[:4], outlier, rows[4:]])})[0]
    assert np.array_equal(np.delete(mixed, 4, axis=0), alone)


def test_bad_inputs_are_errors_not_crashes():
    rng = np.random.default_rng(13)
    qw = quantize_weight(rng.standard_normal((64, 20)).astype(np.float32), 8, 32)
    with pytest.raises(Exception, match="K = 64|dimension|shape|Got invalid"):
        op_session(qw).run(None, {"a": np.zeros((2, 63), np.float32)})
    packed, scales = qmatmul_tensors(qw)

    def session(w: np.ndarray, s: np.ndarray, layout: int, w_input: bool = False) -> ort.InferenceSession:
        node = helper.make_node("QMatMul", ["a", "w", "s"], ["y"], domain="ortinf", K=64, N=20, bits=8, block_size=32, layout=layout)
        inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", 64])]
        if w_input:  # B fed at run time, not a constant
            inputs.append(helper.make_tensor_value_info("w", TensorProto.UINT8, list(w.shape)))
        graph = helper.make_graph([node], "op", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", 20])],
                                  ([] if w_input else [numpy_helper.from_array(w, "w")]) + [numpy_helper.from_array(s, "s")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
        options = ort.SessionOptions()
        library.register(options)
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    with pytest.raises(Exception, match="packed_weight must be uint8"):
        session(packed[:-1], scales, 0).run(None, {"a": np.zeros((2, 64), np.float32)})
    b, nbits_scales = matmul_nbits_tensors(qw)
    with pytest.raises(Exception, match="B must be uint8"):  # layout 1 checks when the session is made
        session(b[:-1], nbits_scales.reshape(-1), 1)
    with pytest.raises(Exception, match="scales must be float32"):
        session(b, nbits_scales.reshape(-1)[:-1], 1)
    with pytest.raises(Exception, match="must be constant initializers"):
        session(b, nbits_scales.reshape(-1), 1, w_input=True)
    with pytest.raises(Exception, match="layout 0 or 1"):
        session(b, nbits_scales.reshape(-1), 2)


def parts_session(parts: list[Quantized], biases: list, swiglu: bool = False, threads: int = 2) -> ort.InferenceSession:
    """One QMatMul node computing 2-3 projections of the same A (attributes N1, N2; inputs 1-3 per part), or, with
    swiglu, silu(gate) * up of two (activation 1, one output): the nodes ortinf/exporter/cpu_fusion.py writes."""
    names, initializers = ["a"], []
    for p, (qw, bias) in enumerate(zip(parts, biases, strict=True)):
        b, s = matmul_nbits_tensors(qw)
        initializers += [numpy_helper.from_array(b, f"w{p}"), numpy_helper.from_array(s.reshape(-1), f"s{p}")]
        names += [f"w{p}", f"s{p}", f"bias{p}" if bias is not None else ""]
        if bias is not None:
            initializers.append(numpy_helper.from_array(bias, f"bias{p}"))
    while names[-1] == "":
        names.pop()
    k = parts[0].k
    widths = {f"N{p}": qw.n for p, qw in enumerate(parts) if p > 0}
    outputs = ["y0"] if swiglu else [f"y{p}" for p in range(len(parts))]
    node = helper.make_node("QMatMul", names, outputs, domain="ortinf", K=k, N=parts[0].n, bits=parts[0].bits,
                            block_size=parts[0].block_size, layout=1, activation=int(swiglu), **widths)
    graph = helper.make_graph([node], "op", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in outputs], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("bits,block,k,widths,m", [(8, 128, 200, (40, 17, 17), 7), (4, 32, 96, (64, 16, 16), 1),
                                                   (4, 32, 130, (33, 70), 5), (8, 32, 64, (20, 20, 3), 13)])
def test_parts_compute_what_one_node_per_part_computes(bits, block, k, widths, m):
    """q, k and v in one node: each output is, bit for bit, what that projection's own QMatMul computes (the same
    per-row quantization of A, the same sums), whatever the widths (ragged tiles in every part) and row count."""
    rng = np.random.default_rng(k + m)
    parts = [quantize_weight(rng.standard_normal((k, n)).astype(np.float32), bits, block) for n in widths]
    biases = [rng.standard_normal(n).astype(np.float32) if p != 1 else None for p, n in enumerate(widths)]
    a = rng.standard_normal((m, k)).astype(np.float32)
    got = parts_session(parts, biases).run(None, {"a": a})
    for qw, bias, y in zip(parts, biases, got, strict=True):
        alone = op_session(qw, bias).run(None, {"a": a})[0]
        assert y.shape == (m, qw.n) and np.array_equal(y, alone)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x.astype(np.float64)))


@pytest.mark.parametrize("bits,block,k,n,m", [(8, 128, 200, 40, 7), (4, 32, 96, 33, 1), (4, 64, 130, 16, 9), (8, 32, 64, 100, 4)])
def test_swiglu_is_silu_of_gate_times_up(bits, block, k, n, m):
    """activation 1: one output, silu(gate(A)) * up(A), against the two projections run alone and silu in float64;
    gates from -120 to 120 (silu's tails: ~0 below, the identity above)."""
    rng = np.random.default_rng(k * n)
    gate, up = (quantize_weight(rng.standard_normal((k, n)).astype(np.float32), bits, block) for _ in range(2))
    biases = [rng.standard_normal(n).astype(np.float32) * 40, None]
    a = rng.standard_normal((m, k)).astype(np.float32) * 3
    got = parts_session([gate, up], biases, swiglu=True).run(None, {"a": a})
    assert len(got) == 1 and got[0].shape == (m, n)
    g = op_session(gate, biases[0]).run(None, {"a": a})[0]
    u = op_session(up).run(None, {"a": a})[0]
    assert np.abs(g).max() > 60 and g.min() < -60  # both tails are exercised
    want = silu(g) * u
    assert np.allclose(got[0], want, rtol=2e-6, atol=1e-30 + 1e-6 * np.abs(u).max())


def test_parts_check_their_inputs():
    rng = np.random.default_rng(17)
    qa, qb = (quantize_weight(rng.standard_normal((64, 20)).astype(np.float32), 8, 32) for _ in range(2))
    qc = quantize_weight(rng.standard_normal((64, 24)).astype(np.float32), 8, 32)
    with pytest.raises(Exception, match="two parts of equal width"):
        parts_session([qa, qc], [None, None], swiglu=True)
    with pytest.raises(Exception, match="two parts of equal width"):
        parts_session([qa, qb, qa], [None, None, None], swiglu=True)
    for n1 in (24, 10**12):  # part 1's weights do not match N1 (an absurd N1 too: checked before anything is allocated)
        with pytest.raises(Exception, match="B must be uint8"):
            parts_with_width(qa, n1)


def parts_with_width(qa: Quantized, n1: int) -> ort.InferenceSession:
    """Two parts over part 0's tensors twice, part 1 declared N1 wide."""
    b, s = matmul_nbits_tensors(qa)
    node = helper.make_node("QMatMul", ["a", "w", "s", "", "w", "s"], ["y0", "y1"], domain="ortinf", K=64, N=20, N1=n1,
                            bits=8, block_size=32, layout=1)
    graph = helper.make_graph([node], "op", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", 64])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, None) for y in ("y0", "y1")],
                              [numpy_helper.from_array(b, "w"), numpy_helper.from_array(s.reshape(-1), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
    options = ort.SessionOptions()
    library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


RSS_PROBE = """
import sys, numpy as np, onnxruntime as ort
from ortinf.kernels import library
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
before = rss()
options = ort.SessionOptions()
library.register(options)
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
written = library.flush_packed()
grown = rss() - before
y = session.run(None, {"a": np.ones((1, int(sys.argv[2])), np.float32)})[0]
print(grown, float(y.sum()), "mapped" if written and " 1 mapped" in written[0] else "packed")
"""


def test_the_mapped_source_pages_are_given_back(tmp_path):
    """A package's B and scales are memory-mapped by ORT (page-aligned external data); QMatMul packs them when
    the session is made and drops the mapped pages, so the session holds the weights once: RSS grows by about
    the packed bytes, not twice them (measured: ~1.0x). The next session maps what the first one packed
    (packed_store.h) and holds the weights once too, as pages of the page cache."""
    import subprocess
    import sys

    import onnx

    from ortinf.exporter.lazy import ALIGN

    k, n = 4096, 8192  # 32 MiB of int8 weights
    rng = np.random.default_rng(17)
    qw = quantize_weight(rng.standard_normal((k, n)).astype(np.float32), 8, 128)
    b, scales = matmul_nbits_tensors(qw)
    data = tmp_path / "w.onnx.data"
    entries = []
    with open(data, "wb") as f:
        for name, array in (("w", b), ("s", scales.reshape(-1))):
            f.seek(-(-f.tell() // ALIGN) * ALIGN)
            offset = f.tell()
            f.write(array.tobytes())
            tensor = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(array.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            entries.append(tensor)
    weight_bytes = b.nbytes + scales.nbytes
    grown = {}
    for layout, (w, s) in ((1, ("w", "s")), ("1 again", ("w", "s")), (0, ("packed", "packed_scales"))):
        if layout == 0:  # the baseline: a session that reads its (never touched) inputs at run time
            packed, packed_scales = qmatmul_tensors(qw)
            entries = [numpy_helper.from_array(packed, "packed"), numpy_helper.from_array(packed_scales, "packed_scales")]
        node = helper.make_node("QMatMul", ["a", w, s], ["y"], domain="ortinf", K=k, N=n, bits=8, block_size=128,
                                layout=0 if layout == 0 else 1)
        graph = helper.make_graph([node], "op", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, k])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], entries)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
        path = tmp_path / f"layout{str(layout)[0]}.onnx"
        if layout == 0:
            onnx.save_model(model, str(path), save_as_external_data=True, location="packed.data")
        else:
            onnx.save_model(model, str(path))
        out = subprocess.run([sys.executable, "-c", RSS_PROBE, str(path), str(k)], capture_output=True, text=True, check=True)
        grown[layout], total, how = out.stdout.split()
        assert how == {1: "packed", "1 again": "mapped", 0: "packed"}[layout]
        want = float((reference(np.ones((1, k), np.float32), qw)).sum())
        assert abs(float(total) - want) <= 1e-4 * abs(want) + 1e-2
    packing = int(grown[1]) - int(grown[0])
    print(f"packing at load grew RSS by {packing / 2**20:.1f} MiB for {weight_bytes / 2**20:.1f} MiB of weights")
    assert 0.8 * weight_bytes < packing < 1.15 * weight_bytes  # without giving the mapped pages back: 2x
    mapping = int(grown["1 again"]) - int(grown[0])
    print(f"mapping the packed store grew RSS by {mapping / 2**20:.1f} MiB")
    assert 0.8 * weight_bytes < mapping < 1.15 * weight_bytes


NARROWER = {"avx512vnni": ["avxvnni", "avx2", "generic"], "avxvnni": ["avx2", "generic"], "avx2": ["generic"], "generic": []}


@pytest.mark.parametrize("isa", ["avxvnni", "avx2", "generic"])
def test_every_build_the_machine_runs(isa):
    """The op tests again under each narrower build this CPU can run (ORTINF_KERNEL_ISA caps the pick),
    so that an AVX-512 VNNI machine checks what an AVX2-only machine, or one without AVX2, computes."""
    best = library.qmatmul_isa()
    if isa not in NARROWER.get(best, []):
        pytest.skip(f"this CPU's best build is {best}: {isa} is not a narrower one it runs")
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "").split()
    if isa == "avxvnni" and "avx_vnni" not in flags:  # AVX-512 VNNI CPUs without the VEX form (Zen 4, Ice Lake)
        pytest.skip("this CPU has no AVX-VNNI")
    rerun_under(isa, __file__, "library.qmatmul_isa()")
