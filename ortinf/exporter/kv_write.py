"""The in-graph KV write: the traced graph's new K/V outputs become ScatterND updates of the pool.

This pass, run on the ONNX graph after tracing, adds one input, `slot_mapping` [num_tokens] (the pool slot of
each scheduled token), and replaces the outputs `new_key.{i}` / `new_value.{i}` with `key_cache_out.{i}` /
`value_cache_out.{i}`, one ScatterND per pool tensor, which the runtime binds to the very buffer it binds as
`key_cache.{i}`, so the write happens in place. The package keeps both forms: model.onnx (with the write) and
model.host-write.onnx (as traced, for host providers where numpy writes faster).

The design (the indices, why ONNX surgery, why order does not matter, the measurements): docs/providers.md,
"The graph writes K/V into its own pool" and "One package, two write paths"."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortinf.manifest import (
    CONTRIB_PAGED,
    CPU_MODEL_NAME,
    HOST_WRITE_MODEL_NAME,
    MODEL_NAME,
    SLOT_MAPPING,
    WEIGHTS_NAME,
    DecoderSpec,
    cache_names,
    new_kv_names,
)


def add_kv_write(model: onnx.ModelProto, num_layers: int, num_kv_heads: int) -> None:
    """Adds the KV write to a traced decoder graph (in memory; its weights may be external)."""
    graph = model.graph
    pool_inputs, pool_outputs = cache_names(num_layers)
    new_kv = new_kv_names(num_layers)
    by_name = {o.name: o for o in graph.output}
    if any(name not in by_name for name in new_kv):
        raise ValueError("the traced graph lacks the new K/V outputs the KV write replaces")

    graph.input.append(helper.make_tensor_value_info(SLOT_MAPPING, TensorProto.INT64, ["num_tokens"]))
    graph.initializer.extend([
        numpy_helper.from_array(np.arange(num_kv_heads, dtype=np.int64).reshape(-1, 1, 1), "kvw.heads"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "kvw.two"),
        numpy_helper.from_array(np.array([0, 2], dtype=np.int64), "kvw.axes02"),
        numpy_helper.from_array(np.array([num_kv_heads], dtype=np.int64), "kvw.kvh"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "kvw.one"),
    ])
    nodes = [
        helper.make_node("Shape", [pool_inputs[0]], ["kvw.pool_shape"]),
        helper.make_node("Gather", ["kvw.pool_shape", "kvw.two"], ["kvw.block_size"], axis=0),  # [1]
        helper.make_node("Div", [SLOT_MAPPING, "kvw.block_size"], ["kvw.block"]),
        helper.make_node("Mod", [SLOT_MAPPING, "kvw.block_size"], ["kvw.offset"]),
        helper.make_node("Shape", [SLOT_MAPPING], ["kvw.num_tokens"]),
        helper.make_node("Concat", ["kvw.kvh", "kvw.num_tokens", "kvw.one"], ["kvw.index_shape"], axis=0),
        helper.make_node("Expand", ["kvw.heads", "kvw.index_shape"], ["kvw.head_index"]),
        helper.make_node("Unsqueeze", ["kvw.block", "kvw.axes02"], ["kvw.block3"]),
        helper.make_node("Expand", ["kvw.block3", "kvw.index_shape"], ["kvw.block_index"]),
        helper.make_node("Unsqueeze", ["kvw.offset", "kvw.axes02"], ["kvw.offset3"]),
        helper.make_node("Expand", ["kvw.offset3", "kvw.index_shape"], ["kvw.offset_index"]),
        helper.make_node("Concat", ["kvw.head_index", "kvw.block_index", "kvw.offset_index"], ["kvw.indices"], axis=2),
    ]
    for pool_in, pool_out, new in zip(pool_inputs, pool_outputs, new_kv):
        nodes.append(helper.make_node("Transpose", [new], [f"kvw.{new}"], perm=[1, 0, 2]))
        nodes.append(helper.make_node("ScatterND", [pool_in, "kvw.indices", f"kvw.{new}"], [pool_out]))
    graph.node.extend(nodes)

    pool_types = {i.name: i.type for i in graph.input}
    kept = [o for o in graph.output if o.name not in new_kv]
    del graph.output[:]
    graph.output.extend(kept)
    for pool_in, pool_out in zip(pool_inputs, pool_outputs):
        value = onnx.ValueInfoProto()
        value.name = pool_out
        value.type.CopyFrom(pool_types[pool_in])
        graph.output.append(value)


def place_decoder(traced: Path, stage: Path, spec: DecoderSpec,
                  transform: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None,
                  cpu_traced: Path | None = None,
                  cpu_transform: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None) -> tuple[list[str], list[str]]:
    """Writes the decoder graphs into the package, sharing one weights file: the host-write graph
    (as traced) and model.onnx (with the KV write). The contrib paged kernel writes its pool itself:
    its traced graph is model.onnx, alone. `cpu_traced`, the same model traced with the CPU kernel
    library's op, becomes model.cpu.onnx (with the KV write), its weights pointing into the same file.
    `transform` (quantization) rewrites the traced graph first, `cpu_transform` the CPU one (else
    `transform` does). Returns model.onnx's input and
    output names."""
    model = onnx.load(str(traced), load_external_data=True)
    if transform is not None:
        model = transform(model)
    digests = {digest(t): t.name for t in model.graph.initializer if len(t.raw_data) >= 1024}
    if spec.kernel == CONTRIB_PAGED:
        onnx.save_model(model, str(stage / MODEL_NAME), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=WEIGHTS_NAME, size_threshold=1024)
    else:
        onnx.save_model(model, str(stage / HOST_WRITE_MODEL_NAME), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=WEIGHTS_NAME, size_threshold=1024)  # leaves `model` referring to the weights file
        add_kv_write(model, spec.num_layers, spec.num_kv_heads)
        onnx.save_model(model, str(stage / MODEL_NAME))
    if cpu_traced is not None:
        cpu = onnx.load(str(cpu_traced), load_external_data=True)
        constants_to_initializers(cpu)
        if (cpu_transform or transform) is not None:
            cpu = (cpu_transform or transform)(cpu)
        add_kv_write(cpu, spec.num_layers, spec.num_kv_heads)
        if share_weights(cpu, model, digests):  # ortinf.MoE's packed experts: a file of their own
            onnx.save_model(cpu, str(stage / CPU_MODEL_NAME), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=CPU_MODEL_NAME + ".data", size_threshold=1024)
        else:
            onnx.save_model(cpu, str(stage / CPU_MODEL_NAME))
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers], [o.name for o in model.graph.output]


def constants_to_initializers(model: onnx.ModelProto, min_bytes: int = 1024) -> None:
    """Large Constant nodes become initializers (so the weights file holds them and the quantizer finds
    them): tensors the tracer made from numpy at trace time, such as ortinf.MoE's packed experts
    (ortinf/exporter/moe.py), are traced as Constant nodes, which would sit inside the graph's protobuf."""
    graph = model.graph
    kept = []
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or value is None or len(value.raw_data) < min_bytes:
            kept.append(node)
            continue
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
    del graph.node[:]
    graph.node.extend(kept)


def digest(tensor: onnx.TensorProto) -> bytes:
    return hashlib.blake2b(tensor.raw_data + bytes(tensor.data_type) + str(list(tensor.dims)).encode(), digest_size=20).digest()


def share_weights(graph: onnx.ModelProto, saved: onnx.ModelProto, digests: dict[bytes, str]) -> int:
    """Points `graph`'s initializers at the bytes `saved` already wrote to the weights file (matched by
    content, since two traces name constant-folded weights differently). Returns the bytes of large
    weights it cannot match: none for a dense decoder (both traces fold the same weights, and a quantized
    package's ortinf.QMatMul reads MatMulNBits' own B and scales); ortinf.MoE's packed experts are not
    model.onnx's bytes, and go to a file of their own."""
    external = {t.name: list(t.external_data) for t in saved.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    missing = 0
    for tensor in graph.graph.initializer:
        if len(tensor.raw_data) < 1024:
            continue
        name = digests.get(digest(tensor))
        if name is None or name not in external:
            missing += len(tensor.raw_data)
            continue
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        del tensor.external_data[:]
        tensor.external_data.extend(external[name])
    return missing
