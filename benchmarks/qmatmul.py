"""ortinf.QMatMul beside ORT's MatMulNBits (accuracy level 4, int8 activations, as onnxruntime-genai
runs int8/int4 on CPU) on the same quantized numbers, one node per session, at the row counts a
server sees: 1 (one request decoding), 8 and 32 (batched decode steps), 512 (a prefill chunk), for
the projections of the 0.5b and 1.5b benchmark shapes (benchmarks/compare.py --size).

usage: .venv/bin/python benchmarks/qmatmul.py [--sizes 0.5b 1.5b 7b] [--rows 1 8 32 512] [--record] [--tiny] [--repeats N]

Each cell also gives QMatMul's weight-read rate (the weight and scale bytes of one call over its time), the figure to
hold against the machine's streaming bandwidth (benchmarks/bandwidth.py) at one row.

Eight different weights per shape (one node each, in one graph) are run in turn so that the one-row case reads its weights from memory,
not from a cache that holds them from the last call (the 0.5b MLP weights are 4.4 MB at int8). Also
printed: the activation-quantization error per block size (the op's per-token rounding of a
standard-normal activation row against the exact product with the same quantized weights).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from record import finish

from ortinf.exporter.quantize import matmul_nbits_tensors, qmatmul_tensors, quantize_weight
from ortinf.kernels import library
from ortinf.matrix import machine

SHAPES = {"0.5b": [(896, 4864), (4864, 896), (896, 1152)], "1.5b": [(1536, 8960), (8960, 1536), (1536, 2048)],
          "7b": [(3584, 18944), (18944, 3584), (3584, 4608)]}  # Qwen2.5-7B: up/gate, down, fused q/k/v
ROWS = (1, 8, 32, 512)
WEIGHTS = 8


def session(weights: list, op: str, threads: int = 2) -> ort.InferenceSession:
    """One graph with a node per weight, all reading the same rows (ORT runs them one after another,
    as a decoder's MatMuls run; one session, so one thread pool: separate sessions' spinning pools
    fight over the cores and made the first version of this table noise)."""
    nodes, initializers, outputs = [], [], []
    for i, qw in enumerate(weights):
        k, n = qw.k, qw.n
        if op == "QMatMul":
            packed, scales = qmatmul_tensors(qw)
            nodes.append(helper.make_node("QMatMul", ["a", f"w{i}", f"s{i}"], [f"y{i}"], domain="ortinf", K=k, N=n, bits=qw.bits,
                                          block_size=qw.block_size))
        else:
            packed, scales = matmul_nbits_tensors(qw)
            scales = scales.reshape(-1)
            nodes.append(helper.make_node("MatMulNBits", ["a", f"w{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft", K=k, N=n,
                                          bits=qw.bits, block_size=qw.block_size, accuracy_level=4))
        initializers += [numpy_helper.from_array(packed, f"w{i}"), numpy_helper.from_array(scales, f"s{i}")]
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", n]))
    domain = "ortinf" if op == "QMatMul" else "com.microsoft"
    graph = helper.make_graph(nodes, "op", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", weights[0].k])], outputs,
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def best_ms(graph: ort.InferenceSession, a: np.ndarray, repeats: int, nodes: int) -> float:
    """Milliseconds per node: the best of `repeats` runs of the graph, over its node count."""
    graph.run(None, {"a": a})
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        graph.run(None, {"a": a})
        best = min(best, time.perf_counter() - start)
    return best / nodes * 1e3


def activation_error(block: int, k: int = 896, n: int = 256) -> float:
    """Relative error of the op against the exact product of the same rows with the same quantized
    weights: what quantizing the activations per token and block costs."""
    rng = np.random.default_rng(block)
    qw = quantize_weight(rng.standard_normal((k, n)).astype(np.float32), 8, block)
    a = rng.standard_normal((16, k)).astype(np.float32)
    got = session([qw], "QMatMul").run(None, {"a": a})[0]
    exact = a.astype(np.float64) @ qw.dequantized().astype(np.float64)
    return float(np.linalg.norm(got - exact) / np.linalg.norm(exact))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="one small shape, 2 weights (smoke test)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per cell (best is reported)")
    parser.add_argument("--sizes", nargs="*", choices=sorted(SHAPES), default=["0.5b", "1.5b"], help="model shapes whose projections are timed")
    parser.add_argument("--rows", nargs="*", type=int, default=list(ROWS), help="activation rows per call")
    args = parser.parse_args()
    if library.load() is None:
        raise SystemExit("the kernel library is not built: python -m ortinf.kernels.build")
    shapes = {"tiny": [(128, 64)]} if args.tiny else {size: SHAPES[size] for size in args.sizes}
    rows = (1, 8) if args.tiny else tuple(args.rows)
    count = 2 if args.tiny else WEIGHTS
    rng = np.random.default_rng(0)
    lines = [f"### ortinf.QMatMul ({library.qmatmul_isa()}) vs MatMulNBits (accuracy level 4), ms per call, 2 threads "
             f"({time.strftime('%Y-%m-%d')})", "", f"Machine: {machine()}", "",
             "| size | K x N | weights | " + " | ".join(f"{m} rows: QMatMul / MatMulNBits (ratio; QMatMul's weight GB/s)" for m in rows)
             + " |",
             "|---|---|---|" + "---:|" * len(rows)]
    for size, dims in shapes.items():
        for k, n in dims:
            for bits, block in ((8, 128), (4, 32), (4, 64)):
                weights = [quantize_weight(rng.standard_normal((k, n)).astype(np.float32) * 0.02, bits, block) for _ in range(count)]
                ours, theirs = session(weights, "QMatMul"), session(weights, "MatMulNBits")
                cells = []
                for m in rows:
                    a = rng.standard_normal((m, k)).astype(np.float32)
                    q, o = best_ms(ours, a, args.repeats, count), best_ms(theirs, a, args.repeats, count)
                    rate = (k * n * bits / 8 + k // block * n * 4) / (q * 1e-3) / 1e9  # weight and scale bytes per second
                    cells.append(f"{q:.3f} / {o:.3f} ({o / q:.2f}x; {rate:.0f} GB/s)")
                lines.append(f"| {size} | {k} x {n} | int{bits}, block {block} | " + " | ".join(cells) + " |")
    lines += ["", "Activation quantization error of QMatMul (per token and block, int8 weights; relative L2 error against "
              "the exact product with the same quantized weights, 16 standard-normal rows, K = 896): "
              + ", ".join(f"block {b}: {activation_error(b):.2e}" for b in (32, 64, 128, 256))]
    finish(lines, args.record)


if __name__ == "__main__":
    main()
