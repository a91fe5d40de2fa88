"""One-token decode steps of two CPU kernel graphs of one model side by side: nodes per step after ORT's optimizer,
ms per step (interleaved rounds, both sessions alive, neither spinning), and ORT's profile of where a step goes
(the weights' GEMVs against every other node). Made for issue 43's graph work (ortinf/exporter/cpu_fusion.py): PKG
against --before, the same model exported before a change to the graph, or by default against PKG's own graph
with one QMatMul per weight (cpu_fusion.unfuse: q/k/v and gate/up/silu split again), so the table is a ratio on
one machine.

usage: .venv/bin/python benchmarks/graph_nodes.py PKG [--before OLD_PKG] [--context 190] [--rounds 12] [--record]
       .venv/bin/python benchmarks/graph_nodes.py --tiny     (a 2-layer llama at int4, exported here)
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from decode_step import chunks_for, cpu_flags
from export_llama import TINY, build
from record import finish

import ortinf
from ortinf.exporter import cpu_fusion
from ortinf.kernels import library
from ortinf.manifest import CPU_MODEL_NAME, WEIGHTS_NAME, Manifest
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import build_model_input

BLOCK_SIZE, NUM_BLOCKS, THREADS, STEPS = 16, 1024, 2, 10
WEIGHT_OPS = ("QMatMul", "BMatMul", "MatMul", "MoE")


def optimized_nodes(package: Path) -> int:
    """Nodes of model.cpu.onnx after ORT's optimizer (the graph a step runs)."""
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        options.log_severity_level = 3  # not the warning that an optimized model is machine-specific
        library.register(options)
        ort.InferenceSession(str(package / CPU_MODEL_NAME), options, providers=["CPUExecutionProvider"])
        return len(onnx.load(options.optimized_model_filepath, load_external_data=False).graph.node)


def profile(package: Path, model_input, folder: Path) -> dict[str, float]:
    """ms per step: the weights' ops, and everything else (ORT's profiler, which adds its own overhead)."""
    graph = DecoderGraph(package, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, provider="cpu", intra_op_threads=THREADS,
                         cpu_kernel=True, profile_prefix=str(folder / package.name))
    for _ in range(STEPS + 2):
        graph.run(model_input)
    events = json.loads(Path(graph.session.end_profiling()).read_text())
    del graph
    gc.collect()
    split: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            kind = "weights" if event["args"]["op_name"] in WEIGHT_OPS else "other"
            split[kind] += event["dur"] / 1e3 / (STEPS + 2)
    return dict(split)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path, nargs="?", help="an int8/int4 package with a CPU kernel graph")
    parser.add_argument("--before", type=Path, help="the same model exported before the change (default: PKG unfused)")
    parser.add_argument("--tiny", action="store_true", help="export a 2-layer llama at int4 and run a few rounds (smoke test)")
    parser.add_argument("--context", type=int, default=190, help="tokens already in the sequence's cache (default 190)")
    parser.add_argument("--rounds", type=int, default=12, help=f"interleaved rounds of {STEPS} steps per package (default 12)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.tiny:
            build(root / "hf", **TINY)
            ortinf.export(root / "hf", root / "tiny-int4", dtype="int4", progress=False, quality_gate="record")
            args.package, args.rounds = root / "tiny-int4", 2
        if args.package is None:
            parser.error("give a package (or --tiny)")
        before = args.before or unfused_copy(args.package, root / (args.package.name + "-unfused"))
        finish(measure(before, args.package, args), args.record)


def unfused_copy(package: Path, out: Path) -> Path:
    """`package` with its CPU graph one QMatMul per weight; the weights file hard-linked (ORT wants it in the folder)."""
    shutil.copytree(package, out, ignore=shutil.ignore_patterns(WEIGHTS_NAME))
    (out / WEIGHTS_NAME).hardlink_to(package / WEIGHTS_NAME)
    model = onnx.load(str(out / CPU_MODEL_NAME), load_external_data=False)
    cpu_fusion.unfuse(model)
    onnx.save_model(model, str(out / CPU_MODEL_NAME))
    return out


def measure(before: Path, after: Path, args: argparse.Namespace) -> list[str]:
    packages = [before, after]
    manifest = Manifest.load(after)
    vocab = manifest.decoder.vocab_size
    model_input = build_model_input(chunks_for([(args.context, 1)], np.random.default_rng(0), vocab), BLOCK_SIZE)
    graphs = [DecoderGraph(p, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, provider="cpu", intra_op_threads=THREADS,
                           cpu_kernel=True, spin=False) for p in packages]
    times: list[list[float]] = [[] for _ in packages]
    for graph in graphs:
        for _ in range(3):
            graph.run(model_input)
    for _ in range(args.rounds):
        for graph, row in zip(graphs, times, strict=True):
            for _ in range(STEPS):
                start = time.perf_counter()
                graph.run(model_input)
                row.append((time.perf_counter() - start) * 1e3)
    del graphs
    gc.collect()
    with tempfile.TemporaryDirectory() as tmp:
        splits = [profile(p, model_input, Path(tmp)) for p in packages]
    layers = manifest.decoder.num_layers
    lines = [f"### One-token decode step, CPU kernel graph before / after: {manifest.architecture} {manifest.dtype}, "
             f"{layers} layers, context {args.context}, {THREADS} threads", "",
             f"Machine: CPU flags {cpu_flags()}. Steps timed in {args.rounds} interleaved rounds of {STEPS} per package "
             "(both sessions alive, no spinning); profile: ORT's profiler (adds its own overhead per node).", "",
             "| graph | nodes per step (after ORT's optimizer) | per layer | median ms | p10 ms | profile: weight ops ms | profile: other nodes ms |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for package, row, split in zip(packages, times, splits, strict=True):  # (before, after)
        nodes = optimized_nodes(package)
        row.sort()
        lines.append(f"| {package.name} | {nodes} | {nodes / layers:.1f} | {statistics.median(row):.2f} | "
                     f"{row[len(row) // 10]:.2f} | {split.get('weights', 0.0):.2f} | {split.get('other', 0.0):.2f} |")
    old, new = (statistics.median(row) for row in times)
    lines += ["", f"- median step: {old / new:.2f}x faster ({old:.2f} -> {new:.2f} ms)"]
    return lines


if __name__ == "__main__":
    sys.exit(main())
