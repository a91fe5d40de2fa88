"""One graph call on the CPU provider: the portable kernel's graph (model.onnx) against the CPU kernel
library's (model.cpu.onnx, ortinf.PagedAttention), on the engine benchmark's 33.6M llama.

usage: .venv/bin/python benchmarks/decode_step.py [--dtype fp32|int8|int4] [--profile] [--record] [--tiny]

Cases are the shapes the engine benchmark hits: a 32-sequence decode at context 190, the workload's
ragged decode (contexts 124..248), one sequence at 190 and at 1,000, a 16 x 126-token prefill and a
mixed step (a 256-token chunk beside 31 decodes). Blocks are shuffled over the pool, as a long-running
server leaves them. The two graphs are measured in alternating rounds (one session alive at a time:
two sessions' thread pools would spin against each other), and each figure is the median over all
rounds' repeats. --profile adds ORT's per-op-type profile of each graph for the decode and prefill
cases (where the time goes). --tiny runs a 2-layer model with few repeats (the smoke test).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_llama import TINY, build
from record import finish

import ortinf
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

BLOCK_SIZE, NUM_BLOCKS, THREADS = 16, 1024, 2
KERNELS = {"portable": False, "cpu kernel": True}


def cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return platform.processor() or "unknown"
    shown = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    return " ".join(shown) or "no avx2"


def chunks_for(lengths: list[tuple[int, int]], rng: np.random.Generator, vocab: int) -> list[SequenceChunk]:
    """(num_computed, num_new) per sequence; blocks drawn at random from the pool (no two alike)."""
    order = rng.permutation(NUM_BLOCKS).tolist()
    chunks = []
    for computed, new in lengths:
        count = -(-(computed + new) // BLOCK_SIZE)
        chunks.append(SequenceChunk(rng.integers(0, vocab, new).tolist(), computed, order[:count]))
        del order[:count]
    return chunks


def cases(tiny: bool) -> list[tuple[str, list[tuple[int, int]], int]]:
    """(name, (computed, new) per sequence, repeats per round)."""
    ragged = [(124 + 4 * i, 1) for i in range(32)]
    if tiny:
        return [("decode, 32 seqs at 190", [(190, 1)] * 32, 2), ("decode, 1 seq at 190", [(190, 1)], 2),
                ("prefill, 4 x 40", [(0, 40)] * 4, 1)]
    return [
        ("decode, 32 seqs at 190", [(190, 1)] * 32, 10),
        ("decode, 32 seqs ragged 124..248", ragged, 10),
        ("decode, 1 seq at 190", [(190, 1)], 40),
        ("decode, 1 seq at 1000", [(1000, 1)], 40),
        ("prefill, 16 x 126", [(0, 126)] * 16, 2),
        ("mixed: 256-token chunk + 31 decodes", [(0, 256)] + [(190, 1)] * 31, 4),
    ]


def time_ms(graph: DecoderGraph, model_input, repeats: int) -> list[float]:
    graph.run(model_input)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        graph.run(model_input)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def profile(package: Path, fused: bool, model_input, repeats: int, folder: Path) -> dict[str, float]:
    """ms per call by op type (ORT's profiler), over `repeats` calls after a warm-up."""
    graph = DecoderGraph(package, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, provider="cpu", intra_op_threads=THREADS,
                         cpu_kernel=fused, profile_prefix=str(folder / ("fused" if fused else "portable")))
    graph.run(model_input)
    graph.session.end_profiling()  # drop the warm-up's events: a fresh session profiles only what follows
    del graph
    gc.collect()
    graph = DecoderGraph(package, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, provider="cpu", intra_op_threads=THREADS,
                         cpu_kernel=fused, profile_prefix=str(folder / ("fused" if fused else "portable")))
    for _ in range(repeats):
        graph.run(model_input)
    events = json.loads(Path(graph.session.end_profiling()).read_text())
    by_op: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"] / 1e3 / repeats
    return dict(by_op)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=("fp32", "int8", "int4"), default="fp32", help="package precision (default fp32)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per graph (default 3)")
    parser.add_argument("--profile", action="store_true", help="also print ORT's per-op-type profile of each graph")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model, few repeats (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root / "hf", **(TINY if args.tiny else {}))
        manifest = ortinf.export(root / "hf", root / "pkg", dtype=args.dtype, progress=False)
        if manifest.cpu_kernel is None:
            raise SystemExit("the package has no CPU kernel graph: build the library (python -m ortinf.kernels.build) first")
        vocab = manifest.decoder.vocab_size
        steps = [(name, build_model_input(chunks_for(lengths, rng, vocab), BLOCK_SIZE), repeats)
                 for name, lengths, repeats in cases(args.tiny)]
        times: dict[tuple[str, str], list[float]] = defaultdict(list)
        for _ in range(1 if args.tiny else args.rounds):
            for kernel, fused in KERNELS.items():
                graph = DecoderGraph(root / "pkg", num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, provider="cpu",
                                     intra_op_threads=THREADS, cpu_kernel=fused)
                for name, model_input, repeats in steps:
                    times[name, kernel] += time_ms(graph, model_input, repeats)
                del graph
                gc.collect()
        lines += [f"### One graph call on the CPU provider: portable graph vs ortinf's CPU kernel library, "
                  f"{'tiny 2-layer' if args.tiny else '33.6M'} llama {args.dtype}, {THREADS} threads",
                  "", f"CPU: {platform.machine()}, {cpu_flags()}; medians over {args.rounds} alternating rounds.", "",
                  "| step | tokens | portable ms | cpu kernel ms | speed-up |", "|---|---:|---:|---:|---:|"]
        for name, model_input, _ in steps:
            old, new = statistics.median(times[name, "portable"]), statistics.median(times[name, "cpu kernel"])
            lines.append(f"| {name} | {int(model_input.query_lens.sum())} | {old:.2f} | {new:.2f} | {old / new:.2f}x |")
        if args.profile:
            for name, model_input, repeats in steps:
                if name.startswith("mixed") or "ragged" in name:
                    continue
                columns = {kernel: profile(root / "pkg", fused, model_input, max(2, repeats // 2), root)
                           for kernel, fused in KERNELS.items()}
                ops = sorted(set().union(*columns.values()), key=lambda op: -columns["portable"].get(op, 0.0))
                lines += ["", f"Profile, {name} (ms per call by op type; ORT's profiler, which adds overhead):", "",
                          "| op type | portable | cpu kernel |", "|---|---:|---:|"]
                for op in ops:
                    a, b = columns["portable"].get(op, 0.0), columns["cpu kernel"].get(op, 0.0)
                    if max(a, b) >= 0.05 or args.tiny:
                        lines.append(f"| {op} | {a:.2f} | {b:.2f} |")
                lines.append(f"| total | {sum(columns['portable'].values()):.2f} | {sum(columns['cpu kernel'].values()):.2f} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
