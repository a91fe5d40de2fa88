"""ortinf/exporter/cpu_fusion.py's rewrites, each on a small graph run by onnxruntime before and after: the same
outputs (bit for bit but silu), fewer nodes, and no rewrite where it would change a value."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortinf.exporter import cpu_fusion
from ortinf.exporter.quantize import matmul_nbits_tensors, quantize_weight
from ortinf.kernels import library

pytestmark = pytest.mark.skipif(library.load() is None, reason="the kernel library is not built (python -m ortinf.kernels.build)")

K = 64


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def qmatmul(name: str, a: str, n: int, rng: np.random.Generator, initializers: list, k: int = K) -> onnx.NodeProto:
    b, s = matmul_nbits_tensors(quantize_weight(rng.standard_normal((k, n)).astype(np.float32), 4, 32))
    initializers += [numpy_helper.from_array(b, name + ".B"), numpy_helper.from_array(s.reshape(-1), name + ".scales")]
    return helper.make_node("QMatMul", [a, name + ".B", name + ".scales"], [name + ".y"], name=f"/model/layers.0/{name}",
                            domain="ortinf", K=k, N=n, bits=4, block_size=32, layout=1)


def model(nodes: list, initializers: list, outputs: list[str]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "t", K])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])


def attention_block(rng: np.random.Generator) -> onnx.ModelProto:
    """A layer's shape: q/k/v with biases and Reshape chains (one Reshape target computed from Shape), an MLP
    with gate, silu and up, and a Reshape whose target holds a 0 (copy a dimension: never folded)."""
    inits: list = []
    nodes = [qmatmul(name, "x", n, rng, inits) for name, n in (("q", 32), ("k", 16), ("v", 16))]
    for name, n in (("q", 32), ("k", 16), ("v", 16)):
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), name + ".bias"))
        nodes.append(helper.make_node("Add", [name + ".bias", name + ".y"], [name + ".added"]))
    inits += [numpy_helper.from_array(np.array([1, -1, 4, 4], np.int64), "s4"),
              numpy_helper.from_array(np.array([-1, 4, 4], np.int64), "s3"),
              numpy_helper.from_array(np.array([0, -1, 16], np.int64), "s_zero"),
              numpy_helper.from_array(np.array([0], np.int64), "zero")]
    nodes += [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["batch"]),
              helper.make_node("Concat", ["batch", "s3"], ["dynamic"], axis=0),
              helper.make_node("Reshape", ["k.added", "dynamic"], ["k.r1"]),
              helper.make_node("Reshape", ["k.r1", "s3"], ["k.r2"]),
              helper.make_node("Reshape", ["k.r2", "s4"], ["k.out"]),
              helper.make_node("Reshape", ["v.added", "s4"], ["v.r1"]),
              helper.make_node("Reshape", ["v.r1", "s_zero"], ["v.out"])]  # a 0 in the target: kept as it is
    nodes += [qmatmul("gate", "q.added", 48, rng, inits, k=32), qmatmul("up", "q.added", 48, rng, inits, k=32)]
    nodes += [helper.make_node("Sigmoid", ["gate.y"], ["sig"]), helper.make_node("Mul", ["gate.y", "sig"], ["silu"]),
              helper.make_node("Mul", ["silu", "up.y"], ["mlp"])]
    return model(nodes, inits, ["k.out", "v.out", "mlp"])


def test_a_layer_keeps_its_values_in_fewer_nodes():
    rng = np.random.default_rng(0)
    original = attention_block(rng)
    fused = onnx.ModelProto()
    fused.CopyFrom(original)
    counts = cpu_fusion.fuse(fused)
    assert counts["bias"] == 3 and counts["swiglu"] == 1 and counts["parts"] == 2 and counts["reshapes"] == 2
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("QMatMul") == 2 and "Add" not in ops and "Sigmoid" not in ops and "Concat" not in ops
    assert all("/layers.0/" in n.name for n in fused.graph.node if n.op_type == "QMatMul")
    assert len(original.graph.node) == 19 and len(fused.graph.node) == 5  # q/k/v, 3 Reshapes (v's 0 kept), swiglu
    x = rng.standard_normal((1, 5, K)).astype(np.float32)
    want, got = run(original, {"x": x}), run(fused, {"x": x})
    assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])  # q/k/v: bit for bit
    assert np.allclose(want[2], got[2], rtol=1e-5, atol=1e-6 * np.abs(want[2]).max())  # silu's exp


def test_nothing_is_fused_that_a_graph_output_or_another_reader_needs():
    rng = np.random.default_rng(1)
    inits: list = []
    nodes = [qmatmul("gate", "x", 16, rng, inits), qmatmul("up", "x", 16, rng, inits),
             helper.make_node("Sigmoid", ["gate.y"], ["sig"]), helper.make_node("Mul", ["gate.y", "sig"], ["silu"]),
             helper.make_node("Mul", ["silu", "up.y"], ["mlp"])]
    inits.append(numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "bias"))
    nodes.append(helper.make_node("Add", ["up.y", "bias"], ["up.biased"]))  # up's product has a second reader
    original = model(nodes, inits, ["mlp", "up.biased", "gate.y"])  # and gate's is a graph output
    fused = onnx.ModelProto()
    fused.CopyFrom(original)
    counts = cpu_fusion.fuse(fused)
    assert counts["swiglu"] == 0 and counts["bias"] == 0 and counts["parts"] == 1  # still one node for both
    x = rng.standard_normal((1, 3, K)).astype(np.float32)
    for want, got in zip(run(original, {"x": x}), run(fused, {"x": x}), strict=True):
        assert np.array_equal(want, got)


@pytest.mark.parametrize("dtype", ["int4", "fp32"])
def test_attention_reads_the_projections_and_feeds_the_output_projection(tmp_path, dtype):
    """Rewrite 5 on an exported Qwen2 (q/k/v biases): PagedAttention takes q, k and v as the projections give them
    ([1, T, width], no Reshape in front) and the output projection reads its output directly (no Reshape back, no
    Shape/Gather/Unsqueeze/Concat computing one). The package's tokens against transformers' are the parity tests'."""
    from support.tiny_models import add_byte_tokenizer, build_decoder

    import ortinf
    from ortinf.manifest import CPU_MODEL_NAME

    build_decoder("qwen2", tmp_path / "hf", vocab_size=384)
    add_byte_tokenizer(tmp_path / "hf")
    ortinf.export(tmp_path / "hf", tmp_path / "pkg", dtype=dtype, progress=False)
    graph = onnx.load(str(tmp_path / "pkg" / CPU_MODEL_NAME), load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    projection = "QMatMul" if dtype == "int4" else "MatMul"
    attentions = [n for n in graph.node if n.op_type == "PagedAttention"]
    assert attentions
    for attention in attentions:
        assert [producer[name].op_type for name in attention.input[:3]] in ([projection] * 3, ["Add"] * 3)
        readers = [n for n in graph.node if attention.output[0] in n.input]
        assert [r.op_type for r in readers] == [projection]
    assert not [n for n in graph.node if n.op_type in ("Shape", "Concat") and "/self_attn/" in n.name]


def bmatmul(name: str, a: str, n: int, rng: np.random.Generator, initializers: list, k: int = K) -> onnx.NodeProto:
    import ml_dtypes

    w = rng.standard_normal((k, n)).astype(np.float32).astype(ml_dtypes.bfloat16)
    initializers.append(numpy_helper.from_array(w, name + ".w"))
    return helper.make_node("BMatMul", [a, name + ".w"], [name + ".y"], name=f"/model/layers.0/{name}", domain="ortinf", K=k, N=n)


def test_the_residual_add_is_taken_into_the_projection_that_feeds_it():
    """Rewrite 7: Add(projection, residual) on both sides, over QMatMul (with its folded bias) and BMatMul, and a
    2-D A beside a 3-D residual (the Add's broadcast shape is kept): the same values bit for bit, in fewer nodes; a
    product another node reads, and an Add of a constant, stay as they are."""
    rng = np.random.default_rng(4)
    inits: list = []
    nodes = [qmatmul("o", "x", K, rng, inits)]
    inits += [numpy_helper.from_array(rng.standard_normal(K).astype(np.float32), "o.bias"),
              numpy_helper.from_array(np.array([-1, K], np.int64), "flat"),
              numpy_helper.from_array(rng.standard_normal((1, 1, K)).astype(np.float32), "const")]
    nodes[0].input.append("o.bias")
    nodes += [helper.make_node("Add", ["x", "o.y"], ["h1"]),  # residual first
              bmatmul("down", "h1", K, rng, inits), qmatmul("seen", "h1", K, rng, inits),  # one A each: no parts to merge
              helper.make_node("Reshape", ["h1", "flat"], ["h1.2d"]),
              helper.make_node("BMatMul", ["h1.2d", "down.w"], ["down2.y"], domain="ortinf", K=K, N=K, name="/model/layers.0/down2"),
              helper.make_node("Add", ["down.y", "h1"], ["h2"]),  # product first
              helper.make_node("Add", ["down2.y", "h2"], ["h3"]),  # a [T, K] product and a [1, T, K] residual
              qmatmul("c", "h2", K, rng, inits),
              helper.make_node("Add", ["seen.y", "h3"], ["h4"]), helper.make_node("Neg", ["seen.y"], ["seen.neg"]),
              helper.make_node("Add", ["c.y", "const"], ["c.out"])]
    original = model(nodes, inits, ["h4", "seen.neg", "c.out"])
    fused = onnx.ModelProto()
    fused.CopyFrom(original)
    assert cpu_fusion.fuse(fused)["residual"] == 3
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("Add") == 2  # seen's (another reader) and the constant's
    x = rng.standard_normal((1, 7, K)).astype(np.float32)
    want, got = run(original, {"x": x}), run(fused, {"x": x})
    assert want[0].shape == got[0].shape == (1, 7, K)
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(w, g)
    unfused = onnx.ModelProto()
    unfused.CopyFrom(fused)
    assert cpu_fusion.unfuse(unfused) == 3
    assert all(np.array_equal(w, g) for w, g in zip(want, run(unfused, {"x": x}), strict=True))


@pytest.mark.parametrize("model_type,dtype,per_layer", [("llama", "int8", 2), ("llama", "int4", 2), ("llama", "bf16", 2),
                                                         ("qwen2", "int4", 2), ("gpt_neox", "int4", 1)])
def test_a_package_with_its_residuals_taken_in_equals_it_without(package_factory, tmp_path, model_type, dtype, per_layer):
    """Rewrite 7 on exported packages (Pythia's parallel residual: one Add after both branches' projections): the
    logits of every position, bit for bit, with the residual Adds taken into the projections and split out again."""
    from test_one_weight_file import _logits, unfused_form

    from ortinf.manifest import Manifest

    package = package_factory.package("decoder", model_type=model_type, export={"dtype": dtype})
    split = unfused_form(package, tmp_path / "split", undo=cpu_fusion.split_residuals)
    assert split == per_layer * Manifest.load(package).decoder.num_layers
    tokens = list(np.random.default_rng(2).integers(3, 250, 37))
    assert np.array_equal(_logits(package, tokens), _logits(tmp_path / "split", tokens))


def test_a_residual_of_the_wrong_shape_is_an_error_not_a_stray_read():
    """The ops' residual input (rewrite 7) holds exactly A's rows x N: a broadcast one, or one beside several parts, is
    refused in one line (a graph that fused an Add it should not have fails its export's verification, not silently)."""
    rng = np.random.default_rng(6)
    inits: list = []
    nodes = [qmatmul("o", "x", K, rng, inits), bmatmul("down", "x", K, rng, inits)]
    nodes[0].input.extend([""] * 7 + ["r"])
    nodes[1].input.append("r")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "t", K]),
                                           helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("o.y", "down.y")], inits)
    residual = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
    x = rng.standard_normal((1, 3, K)).astype(np.float32)
    r = rng.standard_normal((1, 3, K)).astype(np.float32)
    o, down = run(residual, {"x": x, "r": r})
    assert o.shape == down.shape == (1, 3, K)
    for bad in (r[:, :1], r[..., :-1]):  # one row broadcast over three; a row one column short
        with pytest.raises(Exception, match="the residual must be float32 \\[..., N\\] with A's rows"):
            run(residual, {"x": x, "r": np.ascontiguousarray(bad)})
