"""Weight-only quantization of a traced decoder (int8 or int4), in numpy, for both of a package's graphs.

Every MatMul whose weight is a constant 2-D initializer (the LM head included, mixture-of-experts routers not)
and the token embedding are quantized once, with symmetric block scales along K (one float scale per
`block_size` rows of K and per column):

  int8: scale = max|w| / 127, q = round(w / scale) in -127..127 (never -128: qmatmul_impl.h's sign trick)
  int4: scale = w* / -8 where w* is the block's value of largest magnitude, q = round(w / scale) clipped to -8..7

The same numbers serve `com.microsoft.MatMulNBits` (model.onnx) and `ortinf.QMatMul` (model.cpu.onnx). The design
(the two forms, the rules' reasons, where the rounding runs, why not ORT's quantizer): docs/exporter.md, "Reduced precision"."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortinf.exporter.config import DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZES
from ortinf.exporter.lazy import Alias, Derived, LazyWeights, Source

log = logging.getLogger(__name__)

BITS = {"int8": 8, "int4": 4}
TILE = 16  # columns per packed tile of ortinf.QMatMul
CPU_OP = "QMatMul"
MOE_OP = "MoE"  # ortinf.MoE (ortinf/kernels/cpu/moe.cc): its stacked expert weights are packed per expert
CPU_DOMAIN = "ortinf"
NBITS_LAYOUT = 1  # QMatMul's `layout` attribute: its weight inputs are MatMulNBits' B and scales (qmatmul.cc)


@dataclass(frozen=True, slots=True)
class Quantized:
    """One weight [K, N] as integers q [Kp, N] (K zero-padded to whole blocks) and scales [blocks, N]."""

    q: np.ndarray
    scales: np.ndarray
    bits: int
    block_size: int
    k: int
    exact: bool = False  # the weights were already on this grid: dequantized() gives them back bit for bit (a Q8_0/Q4_0 GGUF's)

    @property
    def n(self) -> int:
        return self.q.shape[1]

    def dequantized(self) -> np.ndarray:
        """The weights the graphs compute with, [K, N] float32."""
        blocks = self.q.shape[0] // self.block_size
        w = self.q.reshape(blocks, self.block_size, self.n).astype(np.float32) * self.scales[:, None, :]
        return w.reshape(-1, self.n)[: self.k]


def quantize_weight(w: np.ndarray, bits: int, block_size: int) -> Quantized:
    """Symmetric block quantization of w [K, N] along K (rules in the module docstring)."""
    k, n = w.shape
    blocks = -(-k // block_size)
    padded = np.zeros((blocks * block_size, n), np.float32)
    padded[:k] = w
    wb = padded.reshape(blocks, block_size, n)
    if bits == 8:
        scales = np.abs(wb).max(axis=1) / np.float32(127)
        low, high = -127, 127
    else:
        index = np.abs(wb).argmax(axis=1)
        extreme = np.take_along_axis(wb, index[:, None, :], axis=1)[:, 0, :]
        scales = extreme / np.float32(-8)
        low, high = -8, 7
    safe = np.where(scales == 0, np.float32(1), scales)
    q = np.clip(np.rint(wb / safe[:, None, :]), low, high).astype(np.int8)
    exact = bool(np.array_equal(q.astype(np.float32) * scales[:, None, :], wb))
    return Quantized(q.reshape(-1, n), scales.astype(np.float32), bits, block_size, k, exact)


def nbits_tensors(w: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """MatMulNBits' B [N, blocks, block * bits / 8] and scales [N, blocks] of a weight w [K, N], and whether they give
    it back exactly: quantize_weight's rounding, by the kernel library's C++ on every core where it is built
    (ortinf/kernels/cpu/quantize.cc, bit for bit the same; it reads w through its strides, so the transposed view
    of a checkpoint's [N, K] rows is read in place), else by numpy."""
    from ortinf.kernels import library

    native = library.function("ortinf_quantize_nbits")
    k, n = w.shape
    if native is not None and w.dtype == np.float32 and all(s > 0 and s % 4 == 0 for s in w.strides) and k and n:
        blocks = -(-k // block_size)
        b = np.empty((n, blocks, block_size * bits // 8), np.uint8)
        scales = np.empty((n, blocks), np.float32)
        exact = native(ctypes.c_void_p(w.ctypes.data), ctypes.c_int64(k), ctypes.c_int64(n), ctypes.c_int64(w.strides[0] // 4),
                       ctypes.c_int64(w.strides[1] // 4), ctypes.c_int(bits), ctypes.c_int64(block_size),
                       ctypes.c_void_p(b.ctypes.data), ctypes.c_void_p(scales.ctypes.data), ctypes.c_int(_threads()))
        if exact >= 0:
            return b, scales, bool(exact)
    qw = quantize_weight(np.asarray(w, np.float32), bits, block_size)
    b, scales = matmul_nbits_tensors(qw)
    return b, scales, qw.exact


def _threads() -> int:
    """Cores for the quantizer: OMP_NUM_THREADS where set (a test worker's share), else the cores this process may use."""
    try:
        return int(os.environ.get("OMP_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))
    except (ValueError, AttributeError):
        return os.cpu_count() or 1


def matmul_nbits_tensors(qw: Quantized) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' B [N, blocks, block * bits / 8] (offset binary) and scales [N, blocks]."""
    blocks = qw.q.shape[0] // qw.block_size
    offset = (qw.q.T.astype(np.int16) + (1 << (qw.bits - 1))).astype(np.uint8)  # [N, Kp]
    if qw.bits == 4:
        offset = offset[:, 0::2] | (offset[:, 1::2] << 4)
    return offset.reshape(qw.n, blocks, -1), np.ascontiguousarray(qw.scales.T)


def qmatmul_tensors(qw: Quantized) -> tuple[np.ndarray, np.ndarray]:
    """ortinf.QMatMul's packed weight (uint8, flat) and scales [tiles, blocks, 16] (qmatmul_impl.h)."""
    kp, n = qw.q.shape
    tiles = -(-n // TILE)
    blocks = kp // qw.block_size
    q = np.zeros((kp, tiles * TILE), np.int16)
    q[:, :n] = qw.q
    u = (q + (1 << (qw.bits - 1))).astype(np.uint8)
    groups = u.reshape(kp // 4, 4, tiles, TILE).transpose(2, 0, 3, 1)  # [tiles, Kp/4, 16 columns, 4 rows of K]
    if qw.bits == 4:
        groups = groups[:, 0::2] | (groups[:, 1::2] << 4)  # groups 2p and 2p+1 share bytes: low, high nibble
    scales = np.zeros((blocks, tiles * TILE), np.float32)
    scales[:, :n] = qw.scales
    return np.ascontiguousarray(groups).reshape(-1), np.ascontiguousarray(scales.reshape(blocks, tiles, TILE).transpose(1, 0, 2))


def quantize(model: onnx.ModelProto, dtype: str, block_size: int | None = None,
             accuracy_level: int = DEFAULT_ACCURACY_LEVEL, cpu: bool = False,
             cache: dict | None = None, lazy: LazyWeights | None = None) -> onnx.ModelProto:
    """The model with its constant-weight MatMuls quantized to `dtype`: MatMulNBits (cpu=False) or
    ortinf.QMatMul (cpu=True, the kernel library's graph). `cache` (weight digest -> Quantized) lets
    the second graph reuse the first graph's rounding. `lazy`: the streaming exporter's placeholder
    weights, whose quantized forms become placeholders too (computed when written: derive_form)."""
    bits, block_size = BITS[dtype], block_size or DEFAULT_BLOCK_SIZES[dtype]
    keep = routers(model.graph)
    model = gemm_to_matmul(model, lazy)
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    users: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    cache = {} if cache is None else cache
    nodes, dropped, added, count, exact = [], set(), [], 0, 0
    made: dict = {}  # a quantized lazy weight's recipe -> the base name of its B and scales (a tied embedding's bytes)
    for node in graph.node:
        if cpu and node.op_type == MOE_OP and node.domain == CPU_DOMAIN:
            added += pack_experts(node, weights, bits, block_size, cache, users, dropped)
            nodes.append(node)
            count += 2
            continue
        weight = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is not None and weight.name in keep:
            weight = None
        if weight is None or len(weight.dims) != 2 or weight.data_type != onnx.TensorProto.FLOAT:
            nodes.append(node)
            continue
        if lazy is not None and lazy.is_lazy(weight):
            base = f"{weight.name}.q{bits}"  # both graphs name (and so share) the same B and scales
            added += _lazy_forms(lazy, weight, base, bits, block_size)
            made[lazy.recipes[weight.name]] = base
            nodes.append(_quantized_node(node, base, *weight.dims, bits, block_size, accuracy_level, cpu))
            users[weight.name] -= 1
            if users[weight.name] == 0:
                dropped.add(weight.name)
            count += 1
            continue
        array = numpy_helper.to_array(weight)
        key = (hashlib.blake2b(array.tobytes(), digest_size=20).digest(), array.shape, bits, block_size)
        qw = cache.get(key)
        if qw is None:
            qw = cache[key] = quantize_weight(array, bits, block_size)
        exact += qw.exact
        k, n = array.shape
        base = f"{weight.name}.q{bits}"
        b, scales = matmul_nbits_tensors(qw)
        added += [numpy_helper.from_array(b, base + ".B"), numpy_helper.from_array(scales.reshape(-1), base + ".scales")]
        nodes.append(_quantized_node(node, base, k, n, bits, block_size, accuracy_level, cpu))
        users[weight.name] -= 1
        if users[weight.name] == 0:
            dropped.add(weight.name)
        count += 1
    embeddings, ids = 0, token_ids(graph)
    for position, node in enumerate(nodes):
        table = weights.get(node.input[0]) if node.op_type == "Gather" and node.input[1] in ids else None
        if table is None or len(table.dims) != 2 or table.data_type != onnx.TensorProto.FLOAT:
            continue
        if table.dims[1] % block_size:
            log.info("the token embedding %s stays fp32: its %d columns are not whole blocks of %d", table.name,
                     table.dims[1], block_size)
            continue
        found = _quantized_rows(table, bits, block_size, lazy, cache, made)
        if found is None:
            continue
        rows, scales, tensors, tied = found
        added += tensors
        nodes[position] = helper.make_node("GatherBlockQuantized", [rows, node.input[1], scales], list(node.output),
                                           name=node.name + ".q", domain="com.microsoft", bits=bits, block_size=block_size,
                                           gather_axis=0, quantize_axis=1)
        users[table.name] -= 1
        if users[table.name] == 0:
            dropped.add(table.name)
        embeddings += 1
        log.info("the token embedding %s is gathered from %s-bit rows%s", table.name, bits,
                 " (the LM head's own bytes: tied)" if tied else "")
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    for domain in (CPU_DOMAIN if cpu else "com.microsoft", "com.microsoft" if embeddings else None):
        if domain is not None and not any(o.domain == domain for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(domain, 1))
    log.info("quantized %d MatMul weights to %s (block size %d, %s); %d kept their values exactly (already on the grid, "
             "as a Q8_0/Q4_0 GGUF's are)", count, dtype, block_size, "ortinf.QMatMul" if cpu else f"MatMulNBits accuracy level {accuracy_level}",
             exact)
    return model


def token_ids(graph: onnx.GraphProto) -> set[str]:
    """input_ids and its reshapes: what a token embedding's Gather reads."""
    return {"input_ids"} | {n.output[0] for n in graph.node if n.op_type in ("Unsqueeze", "Reshape") and n.input[0] == "input_ids"}


def _quantized_rows(table: onnx.TensorProto, bits: int, block_size: int, lazy: LazyWeights | None, cache: dict,
                    made: dict) -> tuple[str, str, list[onnx.TensorProto], bool] | None:
    """The token embedding `table` [V, H] as GatherBlockQuantized's rows [V, H * bits / 8] and scales [V, H / block]:
    rows quantized per block of H exactly as an LM head [H, V] over the same table is (MatMulNBits' B is [V, blocks,
    blob] and its scales [V * blocks]: the same bytes), so a tied model's embedding is its LM head's B and scales,
    written once (lazy Alias). Returns (rows name, scales name, new tensors, tied)."""
    v, h = table.dims
    blocks = h // block_size
    shapes = ([v, blocks * block_size * bits // 8], [v, blocks])
    base = f"{table.name}.q{bits}"
    if lazy is not None and lazy.is_lazy(table):
        recipe = lazy.recipes[table.name]
        if not isinstance(recipe, Source):
            return None
        transposed = Source(recipe.name, recipe.dtype, not recipe.transpose)  # [H, V]: the LM head's recipe
        head = made.get(transposed)
        if head is not None:
            forms = [Alias(head + ".B"), Alias(head + ".scales")]
        else:
            forms = [Derived(transposed, "nbits.B", bits, block_size), Derived(transposed, "nbits.scales", bits, block_size)]
        tensors = [lazy.placeholder(base + suffix, form, shape, kind)
                   for suffix, form, shape, kind in zip((".rows", ".row_scales"), forms, shapes,
                                                        (onnx.TensorProto.UINT8, onnx.TensorProto.FLOAT))]
        return tensors[0].name, tensors[1].name, tensors, head is not None
    # in memory: the rows of their own (a tied head's rounding is reused through `cache`, its bytes are written again)
    array = np.ascontiguousarray(numpy_helper.to_array(table).T)
    key = (hashlib.blake2b(array.tobytes(), digest_size=20).digest(), array.shape, bits, block_size)
    qw = cache.get(key)
    if qw is None:
        qw = cache[key] = quantize_weight(array, bits, block_size)
    b, scales = matmul_nbits_tensors(qw)
    tensors = [numpy_helper.from_array(b.reshape(shapes[0]), base + ".rows"),
               numpy_helper.from_array(scales.reshape(shapes[1]), base + ".row_scales")]
    return tensors[0].name, tensors[1].name, tensors, False


def _quantized_node(node: onnx.NodeProto, base: str, k: int, n: int, bits: int, block_size: int, accuracy_level: int,
                    cpu: bool) -> onnx.NodeProto:
    """The MatMul `node` as QMatMul (cpu) or MatMulNBits over the tensors named `base`.* (the same ones)."""
    if cpu:
        return helper.make_node(CPU_OP, [node.input[0], base + ".B", base + ".scales"], list(node.output),
                                name=node.name + ".q", domain=CPU_DOMAIN, K=k, N=n, bits=bits, block_size=block_size,
                                layout=NBITS_LAYOUT)
    return helper.make_node("MatMulNBits", [node.input[0], base + ".B", base + ".scales"], list(node.output),
                            name=node.name + ".q", domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block_size, accuracy_level=accuracy_level)


def _lazy_forms(lazy: LazyWeights, weight: onnx.TensorProto, base: str, bits: int, block_size: int) -> list[onnx.TensorProto]:
    """Placeholders of a lazy weight's quantized tensors (named `base`.*), their shapes computed as the eager path's are."""
    k, n = weight.dims
    source = lazy.recipes[weight.name]
    blocks = -(-k // block_size)
    return [lazy.placeholder(base + ".B", Derived(source, "nbits.B", bits, block_size), [n, blocks, block_size * bits // 8],
                             onnx.TensorProto.UINT8),
            lazy.placeholder(base + ".scales", Derived(source, "nbits.scales", bits, block_size), [n * blocks], onnx.TensorProto.FLOAT)]


def derive_form(array: np.ndarray, recipe: Derived, memo: dict) -> np.ndarray:
    """A quantized tensor of a weight [K, N] (the writer of ortinf/exporter/lazy.py calls it); `memo` keeps the
    rounding while one weight's B and scales are written, so both come from one rounding."""
    key = (recipe.bits, recipe.block_size)
    forms = memo.get(key)
    if forms is None:
        forms = memo[key] = nbits_tensors(array.astype(np.float32, copy=False), recipe.bits, recipe.block_size)
    b, scales, _ = forms
    return b if recipe.form == "nbits.B" else scales.reshape(-1)


def pack_experts(node: onnx.NodeProto, weights: dict, bits: int, block_size: int, cache: dict, users: dict,
                 dropped: set) -> list[onnx.TensorProto]:
    """Rewrites an ortinf.MoE node's fp32 expert weights (inputs 2 and 4, panels of [E, K, N]) into QMatMul's
    packing per expert ([E, bytes] uint8 and scales [E, tiles, blocks, 16], inputs 2-5); returns the new tensors."""
    from ortinf.exporter.moe import unpanel

    sizes = {a.name: a.i for a in node.attribute}
    added = []
    for index, n in ((2, 2 * sizes["intermediate_size"]), (4, sizes["hidden_size"])):
        tensor = weights[node.input[index]]
        stacked = unpanel(numpy_helper.to_array(tensor), n)
        packed, scales = [], []
        for expert in stacked:  # per column and block of K, as the portable graph's per-expert MatMuls round
            key = (hashlib.blake2b(expert.tobytes(), digest_size=20).digest(), expert.shape, bits, block_size)
            qw = cache.get(key)
            if qw is None:
                qw = cache[key] = quantize_weight(expert, bits, block_size)
            p, sc = qmatmul_tensors(qw)
            packed.append(p)
            scales.append(sc)
        base = f"{tensor.name}.q{bits}"
        added += [numpy_helper.from_array(np.stack(packed), base + ".packed"), numpy_helper.from_array(np.stack(scales), base + ".scales")]
        users[tensor.name] -= 1
        if users[tensor.name] == 0:
            dropped.add(tensor.name)
        node.input[index], node.input[index + 1] = base + ".packed", base + ".scales"
    for attribute in node.attribute:
        if attribute.name == "bits":
            attribute.i = bits
        elif attribute.name == "block_size":
            attribute.i = block_size
    return added


# What may lie between a router's MatMul and its TopK (gpt-oss: Gemm -> Softmax -> Cast -> TopK).
ROUTING_PATH = {"Add", "Softmax", "Sigmoid", "Cast", "Reshape", "Mul", "Div", "Tanh"}


def routers(graph: onnx.GraphProto) -> set[str]:
    """Weights of mixture-of-experts routers: MatMuls/Gemms whose output reaches a TopK within four
    nodes. They stay at full precision: routing is a discrete choice, so rounding the router moves
    tokens to other experts (on the tiny random gpt-oss, int8 top-1 agreement 0.896 with it quantized),
    and a router is K x num_experts, under 1% of a layer's weights."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found = set()
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        frontier = [node.output[0]]
        for _ in range(4):
            nexts = [c for name in frontier for c in consumers.get(name, [])]
            if any(c.op_type == "TopK" or (c.op_type == MOE_OP and c.input[1] in frontier) for c in nexts):
                found.add(node.input[1])
                break
            frontier = [o for c in nexts if c.op_type in ROUTING_PATH for o in c.output]
            if not frontier:
                break
    return found


def gemm_to_matmul(model: onnx.ModelProto, lazy: LazyWeights | None = None) -> onnx.ModelProto:
    """Gemm nodes with a constant weight (GPT-2's Conv1D layers trace to Gemm) as MatMul + Add, which
    the quantizer handles (it rewrites MatMul only). A lazy weight's transpose goes into its recipe."""
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (node.op_type != "Gemm" or node.input[1] not in weights or attrs.get("transA", 0)
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0):
            nodes.append(node)
            continue
        weight = weights[node.input[1]]
        if attrs.get("transB", 0) and lazy is not None and lazy.is_lazy(weight):  # a new placeholder: the recipe's transpose
            source = lazy.recipes[weight.name]
            flipped = lazy.placeholder(weight.name + ".T", replace(source, transpose=not source.transpose),
                                       list(weight.dims)[::-1], weight.data_type)
            if flipped.name not in weights:
                graph.initializer.append(flipped)
                weights[flipped.name] = flipped
            node.input[1] = flipped.name
        elif attrs.get("transB", 0):
            transposed = numpy_helper.from_array(numpy_helper.to_array(weight).T.copy(), weight.name)
            weight.CopyFrom(transposed)
        if len(node.input) > 2 and node.input[2]:
            nodes.append(helper.make_node("MatMul", node.input[:2], [node.output[0] + ".matmul"], name=node.name + ".matmul"))
            nodes.append(helper.make_node("Add", [node.output[0] + ".matmul", node.input[2]], list(node.output), name=node.name + ".bias"))
        else:
            nodes.append(helper.make_node("MatMul", node.input[:2], list(node.output), name=node.name))
    del graph.node[:]
    graph.node.extend(nodes)
    return model
