"""Rewrites of the CPU kernel graph (model.cpu.onnx) that cut the nodes a one-token step runs.

On the graph alone (the weights are not read): a projection's bias Add into QMatMul (bias), SiLU-gated
pairs into one QMatMul (swiglu), the QMatMuls that read the same activations into one node (parts),
chained Reshapes into one (reshapes), the Reshapes around ortinf.PagedAttention dropped (attention views),
the KV write into that op, and the residual Add into the projection before it (residual). Every rewrite
keeps the values bit for bit but the activation, and keeps node names in their `/layers.N/` scope.

The design (each rewrite, why here and at export, what it saves): docs/exporter.md, "The CPU graph's rewrites"."""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from pathlib import Path

import onnx
from onnx import helper, numpy_helper

from ortinf.manifest import SLOT_MAPPING

log = logging.getLogger(__name__)

DOMAIN = "ortinf"
QMATMUL = "QMatMul"
BMATMUL = "BMatMul"
MAX_PARTS = 3  # qmatmul.cc's kMaxParts
RESIDUAL_INPUT = {QMATMUL: 1 + 3 * MAX_PARTS, BMATMUL: 2}  # qmatmul.cc's kResidual; bmatmul.cc's input 2


class _Graph:
    """Producers, consumers and constants of a graph, rebuilt after each rewrite pass."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.producer = {out: node for node in graph.node for out in node.output if out}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                if name:
                    self.consumers[name].append(node)
        self.outputs = {o.name for o in graph.output}
        self.initializers = {i.name: i for i in graph.initializer}

    def only_consumer(self, name: str, node: onnx.NodeProto) -> bool:
        users = self.consumers.get(name, [])
        return name not in self.outputs and len(users) == 1 and users[0] is node

    def constant(self, name: str):
        """The value of an initializer or Constant node output held in the graph (None if it is not one)."""
        if name in self.initializers:
            tensor = self.initializers[name]
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                return None
            return numpy_helper.to_array(tensor)
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attribute in node.attribute:
                if attribute.name == "value":
                    return numpy_helper.to_array(attribute.t)
        return None

    def dims(self, name: str) -> list[int] | None:
        tensor = self.initializers.get(name)
        return list(tensor.dims) if tensor is not None else None


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _plain_qmatmul(node: onnx.NodeProto) -> bool:
    """A QMatMul of one projection over MatMulNBits' tensors (layout 1), no activation: what the exporter writes."""
    if node.op_type != QMATMUL or node.domain != DOMAIN or len(node.output) != 1:
        return False
    a = _attrs(node)
    return a.get("layout") == 1 and not a.get("activation") and not a.get("N1") and not a.get("N2")


def _fold_bias(g: _Graph) -> int:
    removed = []
    for add in g.graph.node:
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2:
            continue
        for side in (0, 1):
            matmul, bias = g.producer.get(add.input[side]), add.input[1 - side]
            if (matmul is None or not _plain_qmatmul(matmul) or len(matmul.input) > 3
                    or not g.only_consumer(matmul.output[0], add)):
                continue
            tensor = g.initializers.get(bias)
            if tensor is None or tensor.data_type != onnx.TensorProto.FLOAT or g.dims(bias) != [_attrs(matmul)["N"]]:
                continue
            matmul.input.append(bias)
            matmul.output[0] = add.output[0]
            removed.append(add)
            break
    _remove(g.graph, removed)
    return len(removed)


def _swiglu(g: _Graph) -> int:
    plans: list[tuple[list[onnx.NodeProto], onnx.NodeProto]] = []
    for mul in g.graph.node:
        if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or len(mul.input) != 2:
            continue
        for side in (0, 1):
            act, up = g.producer.get(mul.input[side]), g.producer.get(mul.input[1 - side])
            if act is None or up is None or act.op_type != "Mul" or not _plain_qmatmul(up):
                continue
            gate, sigmoid = _silu_parts(g, act)
            if gate is None or gate is up or gate.input[0] != up.input[0]:
                continue
            ga, ua = _attrs(gate), _attrs(up)
            if any(ga[key] != ua.get(key) for key in ("K", "N", "bits", "block_size")):
                continue
            if not (g.only_consumer(act.output[0], mul) and g.only_consumer(up.output[0], mul)
                    and g.only_consumer(sigmoid.output[0], act) and gate.output[0] not in g.outputs
                    and {id(n) for n in g.consumers[gate.output[0]]} == {id(sigmoid), id(act)}):
                continue
            node = helper.make_node(QMATMUL, _part_inputs([gate, up]), [mul.output[0]], name=gate.name + ".swiglu",
                                    domain=DOMAIN, K=ga["K"], N=ga["N"], N1=ga["N"], bits=ga["bits"],
                                    block_size=ga["block_size"], layout=1, activation=1)
            plans.append(([gate, sigmoid, act, up, mul], node))
            break
    _apply(g.graph, plans)
    return len(plans)


def _silu_parts(g: _Graph, act: onnx.NodeProto) -> tuple[onnx.NodeProto | None, onnx.NodeProto | None]:
    """(gate QMatMul, Sigmoid) when `act` is gate * Sigmoid(gate)."""
    for side in (0, 1):
        sigmoid, gate = g.producer.get(act.input[side]), g.producer.get(act.input[1 - side])
        if (sigmoid is not None and gate is not None and sigmoid.op_type == "Sigmoid" and sigmoid.domain in ("", "ai.onnx")
                and sigmoid.input[0] == act.input[1 - side] and _plain_qmatmul(gate)):
            return gate, sigmoid
    return None, None


def _part_inputs(parts: list[onnx.NodeProto]) -> list[str]:
    inputs = [parts[0].input[0]]
    for node in parts:
        inputs += [node.input[1], node.input[2], node.input[3] if len(node.input) > 3 else ""]
    while inputs[-1] == "":
        inputs.pop()
    return inputs


def _merge_parts(g: _Graph) -> int:
    groups: dict[tuple, list[onnx.NodeProto]] = defaultdict(list)
    for node in g.graph.node:
        if _plain_qmatmul(node):
            a = _attrs(node)
            groups[node.input[0], a["K"], a["bits"], a["block_size"]].append(node)
    plans: list[tuple[list[onnx.NodeProto], onnx.NodeProto]] = []
    for members in groups.values():
        for start in range(0, len(members) - 1, MAX_PARTS):
            chunk = members[start:start + MAX_PARTS]
            if len(chunk) < 2:
                continue
            a = _attrs(chunk[0])
            widths = {f"N{p}": _attrs(node)["N"] for p, node in enumerate(chunk) if p > 0}
            node = helper.make_node(QMATMUL, _part_inputs(chunk), [m.output[0] for m in chunk], name=chunk[0].name + ".parts",
                                    domain=DOMAIN, K=a["K"], N=a["N"], bits=a["bits"], block_size=a["block_size"], layout=1,
                                    **widths)
            plans.append((chunk, node))
    _apply(g.graph, plans)
    return sum(len(nodes) - 1 for nodes, _ in plans)


def _residual(g: _Graph) -> int:
    replaced: dict[int, onnx.NodeProto] = {}  # id(Add) -> the projection with the residual
    removed: set[int] = set()
    for add in g.graph.node:
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2 or add.input[0] == add.input[1]:
            continue
        for side in (0, 1):
            product, residual = g.producer.get(add.input[side]), add.input[1 - side]
            if product is None or id(product) in removed or not g.only_consumer(product.output[0], add):
                continue
            if not (_plain_qmatmul(product) or (product.op_type == BMATMUL and product.domain == DOMAIN and len(product.input) == 2)):
                continue
            if residual in g.initializers or g.constant(residual) is not None:  # a constant is a bias (rewrite 1), not a residual
                continue
            node = onnx.NodeProto()
            node.CopyFrom(product)
            inputs = list(node.input) + [""] * (RESIDUAL_INPUT[node.op_type] - len(node.input))
            del node.input[:]
            node.input.extend([*inputs, residual])
            node.output[0] = add.output[0]
            replaced[id(add)] = node
            removed.add(id(product))
            break
    keep = [replaced.get(id(node), node) for node in g.graph.node if id(node) not in removed]
    del g.graph.node[:]
    g.graph.node.extend(keep)
    return len(replaced)


def _fold_reshapes(g: _Graph) -> int:
    folded = 0
    for node in g.graph.node:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
            continue
        while True:
            inner = g.producer.get(node.input[0])
            if inner is None or inner.op_type != "Reshape" or inner.domain not in ("", "ai.onnx"):
                break
            shape = g.constant(node.input[1])
            if shape is None or (shape == 0).any() and not _attrs(node).get("allowzero"):
                break
            node.input[0] = inner.input[0]
            folded += 1
    return folded


PROJECTIONS = {("QMatMul", DOMAIN), ("BMatMul", DOMAIN), ("MatMul", "")}  # ops whose input 0 is A, read as rows of K


def _is_projection(g: _Graph, node: onnx.NodeProto) -> bool:
    if (node.op_type, node.domain if node.domain != "ai.onnx" else "") not in PROJECTIONS:
        return False
    return node.op_type != "MatMul" or (g.dims(node.input[1]) is not None and len(g.dims(node.input[1])) == 2)


def _width(g: _Graph, name: str) -> int | None:
    """The last dim of `name` when a projection (or a projection plus a constant bias) makes it: N, the part's N1 / N2,
    or the weight's columns; None otherwise (a norm or a Reshape in between: its shape is not known here)."""
    node = g.producer.get(name)
    if node is None:
        return None
    if node.op_type == "Add" and node.domain in ("", "ai.onnx") and len(node.input) == 2:
        for side in (0, 1):
            width, bias = _width(g, node.input[side]), g.dims(node.input[1 - side])
            if width is not None and bias == [width]:
                return width
        return None
    if not _is_projection(g, node):
        return None
    if node.op_type == "MatMul":
        return g.dims(node.input[1])[1]
    attrs = _attrs(node)
    if attrs.get("activation"):
        return attrs["N"]
    widths = [attrs["N"]] + [attrs[key] for key in ("N1", "N2") if attrs.get(key)]
    index = list(node.output).index(name)
    return widths[index] if index < len(widths) else None


def _attention_views(g: _Graph) -> int:
    removed = 0
    for attention in g.graph.node:
        if attention.op_type != "PagedAttention" or attention.domain != DOMAIN:
            continue
        for i in range(3):  # in front: q, k, v each viewed as [-1, width]
            reshape = g.producer.get(attention.input[i])
            if reshape is None or reshape.op_type != "Reshape" or not g.only_consumer(reshape.output[0], attention):
                continue
            shape = g.constant(reshape.input[1])
            if shape is None or shape.shape != (2,) or shape[0] != -1 or _width(g, reshape.input[0]) != shape[1]:
                continue
            attention.input[i] = reshape.input[0]
            removed += 1
        chain, name = [], attention.output[0]  # behind: the output viewed back as [1, T, hidden] for the projection
        while name not in g.outputs and len(g.consumers.get(name, [])) == 1:
            user = g.consumers[name][0]
            if user.op_type != "Reshape" or user.domain not in ("", "ai.onnx") or user.input[0] != name:
                break
            chain.append(user)
            name = user.output[0]
        users = g.consumers.get(name, [])
        if not chain or name in g.outputs or len(users) != 1 or not _is_projection(g, users[0]) or users[0].input[0] != name:
            continue
        projection = users[0]
        readers = g.consumers.get(projection.output[0], [])
        if projection.output[0] in g.outputs or not readers or any(r.op_type != "Add" or r.domain not in ("", "ai.onnx") for r in readers):
            continue
        projection.input[0] = attention.output[0]
        removed += len(chain)
        kept = [v for v in g.graph.value_info if v.name != projection.output[0]]  # its rank is now A's: no stale shape
        del g.graph.value_info[:]
        g.graph.value_info.extend(kept)
    return removed


SLOT_INPUT, POOL_OUTPUTS = 12, 4  # PagedAttention's slot_mapping input, its key_cache_out / value_cache_out outputs


def _write_source(g: _Graph, name: str, pool_type: int) -> str | None:
    """What ScatterND's updates (through Transpose([1, 0, 2])) come from, past Reshapes and one Cast to the pool's
    type: the tensor whose values the pool receives, or None when anything else stands between."""
    transpose = g.producer.get(name)
    if transpose is None or transpose.op_type != "Transpose" or list(_attrs(transpose).get("perm", [])) != [1, 0, 2]:
        return None
    name = transpose.input[0]
    while (node := g.producer.get(name)) is not None and node.op_type in ("Reshape", "Cast"):
        if node.op_type == "Cast" and _attrs(node)["to"] != pool_type:
            return None
        name = node.input[0]
    return name


def _kv_write(g: _Graph, slot_mapping: str = SLOT_MAPPING) -> int:
    pool_types = {i.name: i.type.tensor_type.elem_type for i in g.graph.input}
    writes = {}  # pool input -> (ScatterND, the tensor its values come from)
    for node in g.graph.node:
        if (node.op_type == "ScatterND" and node.domain in ("", "ai.onnx") and node.output[0] in g.outputs
                and node.input[0] in pool_types and len(g.consumers.get(node.output[0], [])) == 0):
            writes[node.input[0]] = (node, _write_source(g, node.input[2], pool_types[node.input[0]]))
    removed: list[onnx.NodeProto] = []
    for attention in g.graph.node:
        if attention.op_type != "PagedAttention" or attention.domain != DOMAIN or len(attention.input) < 5 or _attrs(attention).get("cross"):
            continue
        key, value = writes.get(attention.input[3]), writes.get(attention.input[4])
        outputs = list(attention.output) + [""] * (4 - len(attention.output))
        if key is None or value is None or len(attention.input) > SLOT_INPUT or len(attention.output) > POOL_OUTPUTS:
            continue
        if key[1] not in (outputs[1], outputs[2], attention.input[1]) or value[1] not in (outputs[3], attention.input[2]):
            continue
        if (pool_types[attention.input[3]] == onnx.TensorProto.INT8) != (key[1] == outputs[2] and value[1] == outputs[3]):
            continue  # an int8 pool gets the op's rows, a float one its keys and values
        attention.input.extend([""] * (SLOT_INPUT - len(attention.input)) + [slot_mapping])
        attention.output.extend([""] * (POOL_OUTPUTS - len(attention.output)) + [key[0].output[0], value[0].output[0]])
        removed += [key[0], value[0]]
    _remove(g.graph, removed)
    return len(removed) // 2


def _unused_outputs(graph: onnx.GraphProto) -> None:
    """PagedAttention's optional outputs 1-3 that nothing reads any more: left out (the op then keeps them in scratch)."""
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for node in graph.node:
        if node.op_type == "PagedAttention" and node.domain == DOMAIN:
            for i in range(1, min(4, len(node.output))):
                if node.output[i] not in used:
                    node.output[i] = ""


def _dead_code(graph: onnx.GraphProto) -> int:
    removed = 0
    while True:
        used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        dead = [node for node in graph.node if not any(out in used for out in node.output if out)]
        if not dead:
            return removed
        _remove(graph, dead)
        removed += len(dead)


def _remove(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    drop = {id(n) for n in nodes}
    keep = [n for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(keep)


def _apply(graph: onnx.GraphProto, plans: list[tuple[list[onnx.NodeProto], onnx.NodeProto]]) -> None:
    """Each plan's new node in place of its nodes, at the earliest one's position: its inputs (A and initializers)
    are there before any of them, and whatever read their outputs comes after it. The graph's node list is
    rebuilt once (protobuf copies the nodes it is given: node objects held from before are stale after)."""
    plan_of = {id(node): index for index, (nodes, _) in enumerate(plans) for node in nodes}
    placed: set[int] = set()
    keep: list[onnx.NodeProto] = []
    for node in graph.node:
        index = plan_of.get(id(node))
        if index is None:
            keep.append(node)
        elif index not in placed:
            keep.append(plans[index][1])
            placed.add(index)
    del graph.node[:]
    graph.node.extend(keep)


def fuse(model: onnx.ModelProto) -> Counter:
    """Applies the rewrites to `model` in place; returns how many of each it made (and nodes removed as dead)."""
    counts: Counter = Counter()
    counts["bias"] = _fold_bias(_Graph(model.graph))
    counts["swiglu"] = _swiglu(_Graph(model.graph))
    counts["parts"] = _merge_parts(_Graph(model.graph))
    counts["reshapes"] = _fold_reshapes(_Graph(model.graph))
    counts["views"] = _attention_views(_Graph(model.graph))
    counts["kv_write"] = _kv_write(_Graph(model.graph))
    counts["residual"] = _residual(_Graph(model.graph))
    counts["dead"] = _dead_code(model.graph)
    _unused_outputs(model.graph)
    return counts


def split_residuals(model: onnx.ModelProto) -> int:
    """The inverse of rewrite 7, in place: each projection with a residual input as the projection and an Add again
    (bit for bit the same values: tests/exporter/test_cpu_fusion.py); returns the nodes split."""
    nodes, split = [], 0
    for node in model.graph.node:
        residual = RESIDUAL_INPUT.get(node.op_type) if node.domain == DOMAIN else None
        if residual is None or len(node.input) <= residual or not node.input[residual]:
            nodes.append(node)
            continue
        split += 1
        product = onnx.NodeProto()
        product.CopyFrom(node)
        inputs = list(node.input[:residual])
        while inputs and inputs[-1] == "":
            inputs.pop()
        del product.input[:]
        product.input.extend(inputs)
        product.output[0] = node.output[0] + ".product"
        nodes += [product, helper.make_node("Add", [product.output[0], node.input[residual]], [node.output[0]],
                                            name=node.name + ".residual")]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return split


def unfuse(model: onnx.ModelProto) -> int:
    """The inverse of rewrites 2, 3 and 7, in place: one QMatMul per weight again (a node of several parts split, a
    swiglu node as gate and up QMatMuls, Sigmoid, Mul, Mul), a residual input an Add again, the graph as traced but
    for biases and Reshapes. For measuring what the fusion gains (benchmarks/graph_nodes.py) and testing what it
    keeps; returns the nodes split."""
    split = split_residuals(model)
    nodes = []
    for node in model.graph.node:
        attrs = _attrs(node)
        widths = [attrs["N"]] + [attrs[key] for key in ("N1", "N2") if attrs.get(key)] if node.op_type == QMATMUL else []
        if len(widths) < 2:
            nodes.append(node)
            continue
        split += 1
        inputs = list(node.input) + [""] * (1 + 3 * len(widths) - len(node.input))
        outputs = [f"{node.output[0]}.part{p}" for p in range(2)] if attrs.get("activation") else list(node.output)
        for p, (n, y) in enumerate(zip(widths, outputs, strict=True)):
            part = [inputs[0], *inputs[1 + 3 * p:3 + 3 * p]] + ([inputs[3 + 3 * p]] if inputs[3 + 3 * p] else [])
            nodes.append(helper.make_node(QMATMUL, part, [y], name=f"{node.name}.{p}", domain=node.domain, K=attrs["K"], N=n,
                                          bits=attrs["bits"], block_size=attrs["block_size"], layout=1))
        if attrs.get("activation"):
            gate, up = outputs
            nodes += [helper.make_node("Sigmoid", [gate], [gate + ".sigmoid"], name=node.name + ".sigmoid"),
                      helper.make_node("Mul", [gate, gate + ".sigmoid"], [gate + ".silu"], name=node.name + ".silu"),
                      helper.make_node("Mul", [gate + ".silu", up], [node.output[0]], name=node.name + ".mul")]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return split


def fuse_file(path: Path) -> Counter:
    """fuse() on a graph file whose weights stay where they are (external data is neither read nor rewritten)."""
    model = onnx.load(str(path), load_external_data=False)
    before = len(model.graph.node)
    counts = fuse(model)
    onnx.save_model(model, str(path))
    log.info("%s: %d -> %d nodes (%s)", path.name, before, len(model.graph.node),
             ", ".join(f"{key} {value}" for key, value in counts.items() if value))
    return counts
