"""The oneDNN route beside ortinf's own kernels: oneDNN 3.13's matmul (the `onednn` wheel, through
benchmarks/peers/onednn_matmul.cc) against ortinf.QMatMul for int8/int4 weights and against ONNX
Runtime's MatMul (MLAS) for fp32, on the projections of the 0.5b and 1.5b benchmark shapes at 1, 8, 32
and 512 rows, 2 threads, the same machine in one run.

usage: bash benchmarks/peers/install_onednn.sh && .venv/bin/python benchmarks/onednn_matmul.py [--record] [--tiny]

oneDNN modes: s8 / s4 are weight decompression (f32 activations, int8 / int4 weights with one scale
per block of K and column, converted inside the matmul); s8s8 is int8 x int8 with the activations'
scales per token and block of K (oneDNN's grouped source scales: what QMatMul computes; oneDNN is
handed already-quantized activations, so its figure leaves out the quantization QMatMul's includes).
"unimplemented" is oneDNN's own answer for this CPU. Eight weights per shape are run in turn so that
the one-row case reads its weights from memory (benchmarks/qmatmul.py's method); medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qmatmul import SHAPES, session
from record import finish

from ortinf.exporter.quantize import quantize_weight
from ortinf.kernels import library
from ortinf.matrix import machine

HARNESS = Path(__file__).resolve().parent.parent / ".venv-bench-onednn" / "bin" / "onednn_matmul"
ROWS = (1, 8, 32, 512)
WEIGHTS, THREADS = 8, 2


def median_ms(graph: ort.InferenceSession, a: np.ndarray, repeats: int, nodes: int) -> float:
    graph.run(None, {"a": a})
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        graph.run(None, {"a": a})
        times.append((time.perf_counter() - start) / nodes * 1e3)
    return statistics.median(times)


def onednn(m: int, k: int, n: int, mode: str, group: int, repeats: int, count: int) -> tuple[str, str]:
    """(ms, implementation) from the harness, or ("unimplemented", why)."""
    if not HARNESS.exists():
        return "not installed", "not installed"
    env = {**os.environ, "DNNL_VERBOSE": "0", "OCL_ICD_FILENAMES": str(HARNESS.parent.parent / "lib" / "libintelocl.so")}
    try:
        done = subprocess.run([str(HARNESS), str(m), str(k), str(n), mode, str(group), str(repeats), str(count)], capture_output=True,
                              text=True, env=env, timeout=300)
    except subprocess.TimeoutExpired:
        return "over 300 s", "timeout"
    if done.returncode != 0:
        return f"crashed (exit {done.returncode})", "crash"
    ms, _, impl = done.stdout.strip().partition(" ")
    return ms, impl  # "unimplemented" and oneDNN's reason when it has no implementation


def cell(ours: float, theirs: str) -> str:
    try:
        return f"{ours:.3f} / {float(theirs):.3f} ({float(theirs) / ours:.2f}x)"
    except ValueError:
        return f"{ours:.3f} / {theirs}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="one small shape, rows 1 and 8 (smoke test)")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per cell (median reported)")
    args = parser.parse_args()
    if not HARNESS.exists():  # the ortinf columns still run; oneDNN's cells say how to get it
        print(f"{HARNESS} is missing: run bash benchmarks/peers/install_onednn.sh for the oneDNN cells", file=sys.stderr)
    if library.load() is None:
        raise SystemExit("the kernel library is not built: python -m ortinf.kernels.build")
    shapes = {"tiny": [(128, 64)]} if args.tiny else SHAPES
    rows = (1, 8) if args.tiny else ROWS
    count = 2 if args.tiny else WEIGHTS
    rng = np.random.default_rng(0)
    lines = [f"### oneDNN 3.13 matmul vs ortinf's kernels, ms per call, {THREADS} threads ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {machine()}; ortinf.QMatMul build {library.qmatmul_isa()}. Cells: ortinf / oneDNN (oneDNN's time "
             "over ortinf's: above 1x ortinf is faster).", "",
             "| size | K x N | ortinf route | oneDNN mode | " + " | ".join(f"{m} rows" for m in rows) + " |",
             "|---|---|---|---|" + "---:|" * len(rows)]
    impls: set[str] = set()
    for size, dims in shapes.items():
        for k, n in dims:
            floats = [rng.standard_normal((k, n)).astype(np.float32) * 0.02 for _ in range(count)]
            routes = [("MatMul (MLAS), fp32", session(floats, "MatMul", k, n), "f32", 32)]
            for bits, block, mode in ((8, 128, "s8"), (8, 128, "s8s8"), (4, 32, "s4")):
                routes.append((f"QMatMul int{bits}, block {block}",
                               session([quantize_weight(w, bits, block) for w in floats], "QMatMul", k, n), mode, block))
            for name, graph, mode, group in routes:
                cells = []
                for m in rows:
                    ours = median_ms(graph, rng.standard_normal((m, k)).astype(np.float32), args.repeats, count)
                    ms, impl = onednn(m, k, n, mode, group, args.repeats, count)
                    impls.add(f"{mode}: {impl}")
                    cells.append(cell(ours, ms))
                lines.append(f"| {size} | {k} x {n} | {name} | {mode} | " + " | ".join(cells) + " |")
    lines += ["", "oneDNN implementations chosen: " + "; ".join(sorted(impls))]
    finish(lines, args.record)


if __name__ == "__main__":
    main()
