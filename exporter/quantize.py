"""Weight-only quantization of a traced decoder: MatMul weights to MatMulNBits (int8 or int4).

ONNX Runtime's own tool (`onnxruntime.quantization.matmul_nbits_quantizer`) rewrites every MatMul
whose weight is a constant into `com.microsoft.MatMulNBits` with blockwise symmetric scales
(block size 32 for int4 and 128 for int8 by default, below). The LM head is a MatMul too and is quantized with the rest; embeddings
(Gather) and the KV pool keep the export dtype. `accuracy_level` chooses the activation precision
of the CPU kernel: 0 keeps the activations in fp32, 4 (the default, as onnxruntime-genai's builder
does on CPU) quantizes them to int8; it is recorded in the manifest.

Measured on the benchmark's 33.6M llama, AVX2 CPU without VNNI, 2 threads (benchmarks/RESULTS.md):
level 4 over level 0, end to end: int8 one request at a time 114 vs 19 tok/s, int4 165 vs 32 tok/s
(level 0's 8-bit kernel at M=1 dequantizes: 1.87 ms for a 512x1536 weight, 0.09 at level 4);
32 requests at once int4 281 vs 164 tok/s, int8 188 vs 216 (level 4's kernel loses at M >= 256, in
prefill). Quality: top-1 agreement with fp32 int8 0.958 at both levels, int4 0.469 vs 0.464; the
known argmax regressions of the int8-activation path did not show here, and the export's quality
gates would refuse a package where they do. Level 4 is not batch-invariant: its kernels differ with
the number of rows (one token vs a batch), so a chunked or preempted run can differ from a free run
after a near-tie (seen on 1 of 5 prompts of a tiny llama); level 0 is exact under scheduling.

Defaults (benchmarks/package_forms.py and a 16-MatMul microbenchmark, AMD EPYC with AVX-512 VNNI,
2 threads, docs/performance.md): int8 blocks of 128 instead of 32 make the level-4 GEMM 1.4x faster
at 32 rows (2.33 vs 3.18 ms for 16 MatMuls of 512x1536 / 1536x512) and in prefill (42 vs 55 ms at
512 rows), and the whole 32-sequence decode step 17.4 -> 15.8 ms, with the same quality (trained
demo llama top-1 0.979 vs 0.984, KL 0.0005 vs 0.0003, greedy 1.00 both; random tiny models
0.953-0.974 vs 0.958-0.984). int4 keeps 32: at 128 the demo's KL went 0.026 -> 0.043 and its
greedy agreement 0.48 -> 0.21, too much for a 1.36x GEMM. Not taken: int8 as DynamicQuantizeMatMul
(per-column weight scales): 1.8-2.5x faster again on VNNI, but it quantizes the activations with one
scale per tensor, so one outlier token (trained LLMs' massive activations) coarsens every row of the
step, other requests' included.

The quantized graph is verified against the fp32 PyTorch model by quality figures, not by a logit
tolerance (exporter/verify.py, verify_quality).
"""

from __future__ import annotations

import logging

import onnx
from onnx import helper, numpy_helper

log = logging.getLogger(__name__)

BITS = {"int8": 8, "int4": 4}
DEFAULT_BLOCK_SIZES = {"int8": 128, "int4": 32}
DEFAULT_ACCURACY_LEVEL = 4


def quantize(model: onnx.ModelProto, dtype: str, block_size: int | None = None,
             accuracy_level: int = DEFAULT_ACCURACY_LEVEL) -> onnx.ModelProto:
    """The model with its constant-weight MatMuls as MatMulNBits of `dtype` (int8 or int4)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    block_size = block_size or DEFAULT_BLOCK_SIZES[dtype]
    model = gemm_to_matmul(model)
    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, accuracy_level=accuracy_level,
                                          bits=BITS[dtype], op_types_to_quantize=("MatMul",))
    quantizer = MatMulNBitsQuantizer(model, algo_config=config)
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    quantizer.process()
    result = quantizer.model.model
    count = sum(node.op_type == "MatMulNBits" for node in result.graph.node)
    log.info("quantized %d MatMul weights to %s (block size %d, accuracy level %d)", count, dtype, block_size, accuracy_level)
    return result


def gemm_to_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """Gemm nodes with a constant weight (GPT-2's Conv1D layers trace to Gemm) as MatMul + Add, which
    the quantizer handles (it rewrites MatMul only)."""
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
        if attrs.get("transB", 0):
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
