"""Rebinding a streamed trace (ortinf/exporter/streaming.py, step 3): the traced graph read every layer's weights from
layer 0's parameter objects; here each node that reads a shared parameter reads its own layer's instead (a placeholder
with the checkpoint tensor as its recipe, ortinf/exporter/lazy.py), computations on parameters alone are split per
layer first, a Transpose of a weight folds into its recipe, and the embedding and LM head take the real vocabulary."""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx

from ortinf.errors import ExportError
from ortinf.exporter.lazy import LazyWeights, Source


@dataclass(frozen=True, slots=True)
class Layout:
    """What rebinding needs of the streamed model (streaming.py's Skeleton): where its layers are, each parameter's
    checkpoint tensor and shape, and its vocabulary."""

    layers_name: str  # the ModuleList's attribute name, as node scopes spell it ("layers", "h")
    layers_prefix: str  # its parameters' prefix ("model.layers")
    sources: dict[str, str]  # parameter name -> checkpoint tensor name
    shapes: dict[str, list[int]]  # parameter name -> the checkpoint tensor's shape
    vocab_size: int


def rebind(model: onnx.ModelProto, skel: Layout, traced_names: dict[str, str], lazy: LazyWeights, dtype: str) -> None:
    """Turns the traced graph's parameters into placeholders: per layer for the shared layer parameters,
    transposes folded into their recipes, the real vocabulary for the embedding and LM head.
    `traced_names`: initializer name in the graph -> the model's parameter name."""
    graph = model.graph
    parameters = {i.name for i in graph.input if i.name in traced_names}  # the trace's parameters are inputs (unfolded())
    kept_inputs = [i for i in graph.input if i.name not in parameters]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    parameters |= {t.name for t in graph.initializer if t.name in traced_names}
    _drop_identities(graph, parameters)
    scope = re.compile(rf"/{re.escape(skel.layers_name)}\.(\d+)/")
    layer0 = f"{skel.layers_prefix}.0."
    shapes = skel.shapes
    data_type = onnx.TensorProto.FLOAT16 if dtype == "float16" else onnx.TensorProto.FLOAT
    kept, made = [], {}

    def placeholder(parameter: str) -> str:
        if parameter not in made:
            made[parameter] = lazy.placeholder(parameter, Source(skel.sources[parameter], dtype), shapes[parameter], data_type)
        return parameter

    for tensor in graph.initializer:
        parameter = traced_names.get(tensor.name)
        if parameter is None:
            kept.append(tensor)  # a constant of the graph's own (shapes, indices, scalars)
    shared = {name for name in parameters if traced_names[name].startswith(layer0)}
    _unshare(graph, parameters, shared, skel.layers_name, data_type)
    for node in graph.node:
        for position, name in enumerate(node.input):
            parameter = traced_names.get(name)
            if parameter is None or name not in parameters:
                continue
            if parameter.startswith(layer0):
                match = scope.search(node.name)
                if match is None:  # the trace is not one the streaming export knows: a defect to report
                    raise ExportError(f"the streaming export cannot bind {node.name or node.op_type}: it reads a layer's "
                                      "weight outside any layer; export with in_memory=True and report this")
                parameter = f"{skel.layers_prefix}.{match.group(1)}.{parameter[len(layer0):]}"
            node.input[position] = placeholder(parameter)
    del graph.initializer[:]
    graph.initializer.extend(kept + list(made.values()))
    _fold_transposes(graph, lazy)
    _fix_vocab_outputs(graph, skel)


def _unshare(graph: onnx.GraphProto, parameters: set[str], shared: set[str], layers_name: str, data_type: int) -> None:
    """Gives each layer its own copy of a computation over a shared parameter.

    Every layer reads layer 0's parameter objects while tracing, and the tracer binds what it computes from
    one to the next layer's use of it: Gemma's RMSNorm computes `1 + weight.float()`, `.float()` of an fp32
    parameter is the parameter itself to PyTorch, so layer 1's Cast reads layer 0's Cast, and so on down the
    layers (a common-subexpression pass would merge them into layer 0's node alike). Rebinding by scope then
    gives every layer layer 0's norm, which a checkpoint whose norms are all equal (HF's init) never shows.
    Here a Cast of a parameter to its own type reads the parameter, and any other computation on parameters
    alone is copied into the scope of each layer that reads it (rebind binds a node by its scope)."""
    outputs = {o.name for o in graph.output}
    alias: dict[str, str] = {}
    kept = []
    for node in graph.node:
        node.input[:] = [alias.get(name, name) for name in node.input]
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type == "Cast" and node.input[0] in shared and to == data_type and node.output[0] not in outputs:
            alias[node.output[0]] = node.input[0]
        else:
            kept.append(node)
    static = {t.name for t in graph.initializer} | parameters  # tensors that no graph input reaches
    derived: dict[str, onnx.NodeProto] = {}  # a tensor computed from parameters alone, one shared -> its node
    for node in kept:
        inputs = [name for name in node.input if name]
        if all(name in static for name in inputs):
            static.update(node.output)
            if any(name in shared or name in derived for name in inputs):
                pristine = onnx.NodeProto()
                pristine.CopyFrom(node)
                derived.update((out, pristine) for out in node.output)
    scope = re.compile(rf"/{re.escape(layers_name)}\.(\d+)/")
    clones: dict[tuple[str, str], str] = {}  # (derived tensor, layer) -> its copy's name
    nodes: list[onnx.NodeProto] = []

    def layer_of(node: onnx.NodeProto) -> str | None:
        match = scope.search(node.name)
        return match.group(1) if match else None

    def clone(name: str, layer: str) -> str:
        source = derived[name]
        if layer_of(source) == layer:
            return name
        if (name, layer) not in clones:
            copy = onnx.NodeProto()
            copy.CopyFrom(source)
            copy.name = scope.sub(f"/{layers_name}.{layer}/", source.name, count=1) + "/unshared"
            for position, read in enumerate(source.input):
                if read in derived:
                    copy.input[position] = clone(read, layer)
            for position, out in enumerate(source.output):
                clones[(out, layer)] = copy.output[position] = f"{out}/{layers_name}.{layer}"
            nodes.append(copy)
        return clones[(name, layer)]

    for node in kept:
        layer = layer_of(node)
        if layer is not None:
            for position, name in enumerate(node.input):
                if name in derived:
                    node.input[position] = clone(name, layer)
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def _drop_identities(graph: onnx.GraphProto, parameters: set[str]) -> None:
    """Identity nodes over parameters (the tracer's, for a weight used twice) read the weight itself."""
    initializers = {t.name for t in graph.initializer} | parameters
    alias = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity" and n.input[0] in initializers}
    if not alias:
        return
    graph_outputs = {o.name for o in graph.output}
    kept = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in alias and n.output[0] not in graph_outputs)]
    for node in kept:
        for position, name in enumerate(node.input):
            if name in alias and name not in graph_outputs:
                node.input[position] = alias[name]
    del graph.node[:]
    graph.node.extend(kept)


def _fold_transposes(graph: onnx.GraphProto, lazy: LazyWeights) -> None:
    """Transpose(weight) nodes become placeholders of the transposed weight (as constant folding would)."""
    tensors = {t.name: t for t in graph.initializer}
    kept = []
    for node in graph.node:
        weight = tensors.get(node.input[0]) if node.op_type == "Transpose" else None
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        if weight is None or not lazy.is_lazy(weight) or len(weight.dims) != 2 or perm != [1, 0]:
            kept.append(node)
            continue
        source = lazy.recipes[weight.name]
        folded = lazy.placeholder(node.output[0], Source(source.name, source.dtype, not source.transpose),
                                  list(weight.dims)[::-1], weight.data_type)
        graph.initializer.append(folded)
        tensors[folded.name] = folded
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in graph.node for name in node.input}
    unused = [t for t in graph.initializer if lazy.is_lazy(t) and t.name not in used]
    for tensor in unused:
        graph.initializer.remove(tensor)


def _fix_vocab_outputs(graph: onnx.GraphProto, skel: Layout) -> None:
    """The logits output's declared vocabulary (the trace saw STAND_IN_ROWS). Only that output: a K/V output
    whose head_dim equals the stand-in's row count must keep its size."""
    from ortinf.manifest import LOGITS

    vocab = skel.vocab_size
    for value in graph.output:
        dims = value.type.tensor_type.shape.dim
        if value.name == LOGITS and len(dims) and dims[-1].HasField("dim_value"):
            dims[-1].dim_value = vocab
