"""ortinf's CPU weight ops beside MLAS and llama.cpp's ggml on the same shapes, one op per call, at the row counts a
server sees: 1 (one request decoding), 2, 4, 8 (batched decode steps; add --rows 32 512 for bigger batches and a
prefill chunk), for the projections of the 0.5b, 1.5b and 7b benchmark shapes (benchmarks/compare.py --size):

- int8 / int4: ortinf.QMatMul vs ORT's MatMulNBits (accuracy level 4, int8 activations, as onnxruntime-genai runs
  int8/int4 on CPU) on the same quantized numbers, and ggml's Q8_0 / Q4_0 (block 32, repacked at load where llama.cpp
  repacks: Q4_0 into 8x8 tiles on AVX2/AVX-512);
- bf16: ortinf.BMatMul vs ggml's BF16;
- fp32: ORT's MatMul (MLAS SGEMM: what ortinf's fp32 graph runs) vs ggml's F32.

usage: .venv/bin/python benchmarks/qmatmul.py [--sizes 0.5b 1.5b 7b] [--rows 1 2 4 8] [--record] [--tiny] [--repeats N]

ggml is timed by benchmarks/peers/ggml_mul_mat.py in the llama.cpp benchmark environment (.venv-bench-llamacpp, made by
benchmarks/peers/install_llama_cpp.sh); without it that column is "-". Each cell also gives ortinf's weight-read
rate (the weight and scale bytes of one call over its time); at one row also its share of the machine's streaming read
rate, the probe's figure (benchmarks/bandwidth.py's measure: the best of its read loops, 2 threads), measured in the same
run before and after the cells (the better of the two; --tiny: a 16 MiB buffer, in cache).

Eight different weights per shape (one node each, in one graph) are run in turn so that the one-row case reads its weights from memory,
not from a cache that holds them from the last call (the 0.5b MLP weights are 4.4 MB at int8). Also
printed: the activation-quantization error per block size (the op's per-token rounding of a
standard-normal activation row against the exact product with the same quantized weights).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import bandwidth
import numpy as np
import onnx
import onnxruntime as ort
import peak
from onnx import TensorProto, helper, numpy_helper
from record import finish

from ortinf.exporter.lazy import numpy_dtype
from ortinf.exporter.quantize import matmul_nbits_tensors, qmatmul_tensors, quantize_weight
from ortinf.kernels import library
from ortinf.matrix import machine

SHAPES = {"0.5b": [(896, 4864), (4864, 896), (896, 1152)], "1.5b": [(1536, 8960), (8960, 1536), (1536, 2048)],
          "7b": [(3584, 18944), (18944, 3584), (3584, 4608)]}  # Qwen2.5-7B: up/gate, down, fused q/k/v
ROWS = (1, 2, 4, 8)
WEIGHTS = 8
ROOT = Path(__file__).resolve().parent
GGML_PYTHON = ROOT.parent / ".venv-bench-llamacpp" / "bin" / "python"


@dataclass(frozen=True)
class Precision:
    """One table row's weight form: ortinf's op, the MLAS op beside it, ggml's type ("" for none)."""

    name: str
    ours: str
    mlas: str
    ggml: str
    bits: int = 0
    block: int = 0

    def weight_bytes(self, k: int, n: int) -> float:
        if self.bits:
            return k * n * self.bits / 8 + k // self.block * n * 4
        return k * n * (4 if self.name == "fp32" else 2)


PRECISIONS = [Precision("fp32", "MatMul", "MatMul", "f32"), Precision("bf16", "BMatMul", "", "bf16"),
              Precision("int8, block 128", "QMatMul", "MatMulNBits", "q8_0", 8, 128),
              Precision("int4, block 32", "QMatMul", "MatMulNBits", "q4_0", 4, 32),
              Precision("int4, block 64", "QMatMul", "MatMulNBits", "", 4, 64)]


def node(op: str, weight, i: int) -> tuple:
    """The node computing y{i} = a x weight with `op`, and its initializers."""
    if op in ("MatMul", "BMatMul"):
        k, n = weight.shape
        if op == "MatMul":
            return helper.make_node("MatMul", ["a", f"w{i}"], [f"y{i}"]), [numpy_helper.from_array(weight, f"w{i}")]
        values = numpy_helper.from_array(weight.astype(numpy_dtype("bfloat16")), f"w{i}")
        return helper.make_node("BMatMul", ["a", f"w{i}"], [f"y{i}"], domain="ortinf", K=k, N=n), [values]
    qw = weight
    if op == "QMatMul":
        packed, scales = qmatmul_tensors(qw)
        made = helper.make_node("QMatMul", ["a", f"w{i}", f"s{i}"], [f"y{i}"], domain="ortinf", K=qw.k, N=qw.n, bits=qw.bits,
                                block_size=qw.block_size)
    else:
        packed, scales = matmul_nbits_tensors(qw)
        scales = scales.reshape(-1)
        made = helper.make_node("MatMulNBits", ["a", f"w{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft", K=qw.k, N=qw.n,
                                bits=qw.bits, block_size=qw.block_size, accuracy_level=4)
    return made, [numpy_helper.from_array(packed, f"w{i}"), numpy_helper.from_array(scales, f"s{i}")]


def session(weights: list, op: str, k: int, n: int, threads: int = 2) -> ort.InferenceSession:
    """One graph with a node per weight, all reading the same rows (ORT runs them one after another,
    as a decoder's MatMuls run; one session, so one thread pool: separate sessions' spinning pools
    fight over the cores and made the first version of this table noise)."""
    nodes, initializers, outputs = [], [], []
    for i, weight in enumerate(weights):
        made, tensors = node(op, weight, i)
        nodes.append(made)
        initializers += tensors
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["m", n]))
    domain = {"QMatMul": "ortinf", "BMatMul": "ortinf", "MatMulNBits": "com.microsoft"}.get(op)
    graph = helper.make_graph(nodes, "op", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])], outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else []))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    library.register(options)
    with tempfile.TemporaryDirectory() as folder:  # external data: 8 fp32 weights of the 7B MLP pass protobuf's 2 GB
        path = Path(folder) / "op.onnx"
        onnx.save_model(model, str(path), save_as_external_data=True, location="op.onnx.data")
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def best_ms(graph: ort.InferenceSession, a: np.ndarray, repeats: int, nodes: int) -> float:
    """Milliseconds per node: the best of `repeats` runs of the graph, over its node count."""
    graph.run(None, {"a": a})
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        graph.run(None, {"a": a})
        best = min(best, time.perf_counter() - start)
    return best / nodes * 1e3


def ggml_times(cells: list[dict], weights: int, repeats: int) -> tuple[list, list]:
    """ggml's ms per call for each cell (benchmarks/peers/ggml_mul_mat.py in llama.cpp's environment) and the buffer
    type each weight ended in; Nones without that environment."""
    if not GGML_PYTHON.exists() or not cells:
        return [None] * len(cells), [None] * len(cells)
    request = json.dumps({"cells": cells, "weights": weights, "repeats": repeats, "threads": 2})
    done = subprocess.run([str(GGML_PYTHON), str(ROOT / "peers" / "ggml_mul_mat.py")], input=request, capture_output=True,
                          text=True, check=True)
    answer = json.loads(done.stdout)
    return answer["ms"], answer["buffers"]


def activation_error(block: int, k: int = 896, n: int = 256) -> float:
    """Relative error of the op against the exact product of the same rows with the same quantized
    weights: what quantizing the activations per token and block costs."""
    rng = np.random.default_rng(block)
    qw = quantize_weight(rng.standard_normal((k, n)).astype(np.float32), 8, block)
    a = rng.standard_normal((16, k)).astype(np.float32)
    got = session([qw], "QMatMul", k, n).run(None, {"a": a})[0]
    exact = a.astype(np.float64) @ qw.dequantized().astype(np.float64)
    return float(np.linalg.norm(got - exact) / np.linalg.norm(exact))


def cell(ours: float, mlas: float | None, ggml: float | None, rate: float, roof: float = 0.0, ops: float = 0.0,
         top: float = 0.0, cached: bool = False) -> str:
    """A cell: the three times, the best peer's over ours, ortinf's weight-read GB/s and, with `roof` (the probe's
    bytes per second), that rate's share of it (`cached`: the graph's weights fit the last-level cache, so the share is
    not of a read from memory); with `top` (the instruction's measured peak, operations per second)
    ortinf's rate (`ops` per call) and its share of that peak."""
    peers = [t for t in (mlas, ggml) if t is not None]
    ratio = f"{min(peers) / ours:.2f}x; " if peers else ""
    shown = " / ".join(f"{t:.3f}" if t is not None else "-" for t in (ours, mlas, ggml))
    share = f", {rate * 1e9 / roof:.0%} of the probe{', weights in L3' if cached else ''}" if roof else ""
    compute = f", {ops / (ours * 1e-3) / 1e9:.0f} GOP/s, {ops / (ours * 1e-3) / top:.0%} of peak" if top else ""
    return f"{shown} ({ratio}{rate:.0f} GB/s{share}{compute})"


def instruction(p: Precision, peaks: dict[str, float]) -> tuple[str, float]:
    """The instruction a precision's GEMM runs on this CPU (ortinf's kernels) and its measured peak (0: unknown)."""
    if p.bits:
        name = "vpdpbusd" if library.qmatmul_isa() == "avx512vnni" else ""
    elif p.ours == "BMatMul" and library.panel_gemm_isa() == "avx512bf16":
        name = "vdpbf16ps"  # the default bf16 math (bmatmul.cc)
    else:
        name = "fp32 FMA, 512-bit" if "fp32 FMA, 512-bit" in peaks else "fp32 FMA, 256-bit"
    return name, peaks.get(name, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="one small shape, 2 weights (smoke test)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per cell (best is reported)")
    parser.add_argument("--sizes", nargs="*", choices=sorted(SHAPES), default=["0.5b", "1.5b", "7b"], help="model shapes whose projections are timed")
    parser.add_argument("--rows", nargs="*", type=int, default=list(ROWS), help="activation rows per call")
    parser.add_argument("--precisions", nargs="*", choices=[p.name.split(",")[0] for p in PRECISIONS], default=None,
                        help="weight forms to time (default: all)")
    args = parser.parse_args()
    if library.load() is None:
        raise SystemExit("the kernel library is not built: python -m ortinf.kernels.build")
    shapes = {"tiny": [(128, 64)]} if args.tiny else {size: SHAPES[size] for size in args.sizes}
    rows = (1, 8) if args.tiny else tuple(args.rows)
    count = 2 if args.tiny else WEIGHTS
    chosen = [p for p in PRECISIONS if args.precisions is None or p.name.split(",")[0] in args.precisions]
    probe_mib, probe_rounds = (16, 1) if args.tiny else (1024, 4)
    probed = [bandwidth.measure(2, probe_mib, probe_rounds)]
    rng = np.random.default_rng(0)
    table = [(size, k, n) for size, dims in shapes.items() for k, n in dims]
    requests = [{"k": k, "n": n, "type": p.ggml, "rows": list(rows)} for _, k, n in table for p in chosen if p.ggml]
    ggml_ms, buffers = ggml_times(requests, count, args.repeats)
    ggml_of = iter(zip(ggml_ms, buffers))
    lines = [f"### ortinf's CPU weight ops ({library.qmatmul_isa()}) vs MLAS and llama.cpp's ggml, ms per call, 2 threads "
             f"({time.strftime('%Y-%m-%d')})", "", f"Machine: {machine()}", "",
             "Each cell: ortinf / MLAS / ggml ms per call (best peer's time over ortinf's: above 1 is ortinf faster; ortinf's "
             "weight and scale bytes read per second). ortinf: QMatMul (int8/int4), BMatMul (bf16), MLAS MatMul (fp32, what "
             "ortinf runs); MLAS: MatMulNBits accuracy level 4 (int8/int4), MatMul (fp32); ggml: Q8_0 / Q4_0 / BF16 / F32 "
             "(block 32, whatever the int8 row's block).", "",
             "| size | K x N | weights | ggml buffer | " + " | ".join(f"{m} rows" for m in rows) + " |",
             "|---|---|---|---|" + "---:|" * len(rows)]
    measured = []  # (row label, cells' figures)
    for size, k, n in table:
        for p in chosen:
            if p.bits:
                weights = [quantize_weight(rng.standard_normal((k, n)).astype(np.float32) * 0.02, p.bits, p.block) for _ in range(count)]
            else:
                weights = [(rng.standard_normal((k, n)) * 0.02).astype(np.float32) for _ in range(count)]
            ours = session(weights, p.ours, k, n)
            mlas = session(weights, p.mlas, k, n) if p.mlas and p.mlas != p.ours else None
            theirs, buffer = next(ggml_of) if p.ggml else (None, None)
            figures = []
            for j, m in enumerate(rows):
                a = rng.standard_normal((m, k)).astype(np.float32)
                q = best_ms(ours, a, args.repeats, count)
                o = best_ms(mlas, a, args.repeats, count) if mlas is not None else None
                figures.append((q, o, theirs[j] if theirs else None, p.weight_bytes(k, n) / (q * 1e-3) / 1e9))
            measured.append((f"| {size} | {k} x {n} | {p.name} | {buffer or '-'} | ", figures))
            print(measured[-1][0] + " | ".join(cell(*f) for f in figures) + " |", file=sys.stderr, flush=True)
            del ours, mlas, weights
    probed.append(bandwidth.measure(2, probe_mib, probe_rounds))
    roof = max(probed)
    peaks = peak.measure(2, 1 if args.tiny else 3)
    for (label, figures), (_, k, n, p) in zip(measured, [(s, k, n, p) for s, k, n in table for p in chosen], strict=True):
        top = instruction(p, peaks)[1]
        cached = count * p.weight_bytes(k, n) <= bandwidth.l3_bytes()
        lines.append(label + " | ".join(cell(*f, roof if m == 1 else 0.0, 2.0 * m * k * n, top if m >= 64 else 0.0, cached)
                                        for m, f in zip(rows, figures)) + " |")
    lines += ["", f"The probe's figure (benchmarks/bandwidth.py, best read loop, 2 threads, {probe_mib} MiB): "
              f"{probed[0] / 1e9:.1f} GB/s before the cells, {probed[1] / 1e9:.1f} after; one-row shares are of "
              f"{roof / 1e9:.1f} GB/s (\"weights in L3\": the {count} weights fit the {bandwidth.l3_bytes() / 2**20:.0f} MiB "
              "last-level cache, not a read from memory). Cells of 64 rows and more: ortinf's operations per second and their share of the "
              f"instruction's peak (benchmarks/peak.py, 2 threads, measured after the cells: "
              + ", ".join(f"{name} {rate / 1e9:.0f} G/s" for name, rate in peaks.items()) + ").", ""]
    lines += ["Activation quantization error of QMatMul (per token and block, int8 weights; relative L2 error against "
              "the exact product with the same quantized weights, 16 standard-normal rows, K = 896): "
              + ", ".join(f"block {b}: {activation_error(b):.2e}" for b in (32, 64, 128, 256))]
    finish(lines, args.record)


if __name__ == "__main__":
    main()
