"""bf16 weights (`--dtype bf16`): a bf16 checkpoint's values kept exactly, at half fp32's bytes.

A traced fp32 decoder becomes a bf16 one by storing its large weights in bf16: every 2-D weight a MatMul
multiplies by (the projections, the LM head) and the embedding table a Gather reads. Each is followed by
one Cast to float32 that keeps the weight's original name, so every node after it is the fp32 graph's.
Norm weights and biases stay fp32. Both graphs point at the same bf16 tensors in model.onnx.data.

The design (how each graph runs the Casts, the math, the tolerance): docs/exporter.md, "Reduced precision"."""

from __future__ import annotations

import logging
from dataclasses import replace

import onnx
from onnx import TensorProto, helper, numpy_helper

from ortinf.exporter.lazy import LazyWeights, numpy_dtype

log = logging.getLogger(__name__)

SUFFIX = ".bf16"
CPU_OP = "BMatMul"  # ortinf.BMatMul: Y = A x W with W bf16 [K, N], A and Y float32
CPU_DOMAIN = "ortinf"


def to_bf16(model: onnx.ModelProto, lazy: LazyWeights | None = None, cpu: bool = False) -> onnx.ModelProto:
    """`model` with its MatMul weights and embedding tables stored in bf16 (module docstring). `lazy`: the
    streaming exporter's placeholders, whose bf16 forms become placeholders too. `cpu`: MatMuls over a bf16
    weight become ortinf.BMatMul nodes instead of Cast + MatMul."""
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    targets: set[str] = set()
    for node in graph.node:
        position = {"MatMul": 1, "Gather": 0}.get(node.op_type)
        if position is None or len(node.input) <= position:
            continue
        weight = weights.get(node.input[position])
        if weight is not None and weight.data_type == TensorProto.FLOAT and len(weight.dims) == 2:
            targets.add(weight.name)
    replaced: dict[str, onnx.TensorProto] = {}
    for name in sorted(targets):
        weight = weights[name]
        if lazy is not None and lazy.is_lazy(weight):
            replaced[name] = lazy.placeholder(name + SUFFIX, replace(lazy.recipes[name], dtype="bfloat16"), weight.dims,
                                              TensorProto.BFLOAT16)
        else:
            values = numpy_helper.to_array(weight).astype(numpy_dtype("bfloat16"))
            replaced[name] = numpy_helper.from_array(values, name + SUFFIX)
    nodes, casts, fused = [], {}, 0
    for node in graph.node:
        if node.op_type == "Gather" and node.input[0] in replaced:  # the rows it picks, widened after: never the table
            rows = node.output[0]
            node.input[0] = replaced[node.input[0]].name
            node.output[0] = rows + SUFFIX
            nodes += [node, helper.make_node("Cast", [node.output[0]], [rows], name=node.name + ".cast", to=TensorProto.FLOAT)]
            continue
        if cpu and node.op_type == "MatMul" and node.input[1] in replaced:
            k, n = weights[node.input[1]].dims
            nodes.append(helper.make_node(CPU_OP, [node.input[0], replaced[node.input[1]].name], list(node.output),
                                          name=node.name + SUFFIX, domain=CPU_DOMAIN, K=k, N=n))
            fused += 1
            continue
        for name in node.input:
            if name in replaced and name not in casts:  # one Cast per weight, before its first fp32 reader
                casts[name] = helper.make_node("Cast", [replaced[name].name], [name], name=name + ".cast", to=TensorProto.FLOAT)
                nodes.append(casts[name])
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept + list(replaced.values()))
    if fused and not any(o.domain == CPU_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(CPU_DOMAIN, 1))
    log.info("stored %d weights in bf16 (%d MatMuls as ortinf.BMatMul)", len(replaced), fused)
    return model

