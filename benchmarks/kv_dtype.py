"""The KV cache's dtype on the CPU kernel graph: fp16 rows against int8 rows (`ortinf export --kv-dtype
int8`: per-token per-head scales, read in place by ortinf.PagedAttention), in quality and in speed.

usage: .venv/bin/python benchmarks/kv_dtype.py [--size toy|0.5b|1.5b] [--dtype int8|int4|fp32] [--record] [--tiny]

Quality: the bundled trained demo llama exported with each pool (and the same weights), the export's
own figures against the fp32 PyTorch model: the CPU graph's max abs logit difference (prefill + 8
decode steps), top-1 agreement and mean KL over 4 x 48 positions, greedy agreement over 32 tokens.
Speed: one graph call of the benchmark llama (benchmarks/compare.py's shapes, random weights) per
case, the two packages in alternating rounds (one session alive at a time), medians. Long contexts
are where the pool's bytes matter: a decode step reads every cached row of every sequence.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import SIZES, TINY
from decode_step import time_ms
from export_llama import build
from record import finish

import ortinf
from ortinf.bundled import DEMO_LLAMA
from ortinf.manifest import Manifest
from ortinf.matrix import machine
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

BLOCK_SIZE, THREADS = 16, 2
POOLS = ("fp16", "int8")


def cases(tiny: bool) -> list[tuple[str, list[tuple[int, int]], int]]:
    """(name, (cached, new) per sequence, repeats per round)."""
    if tiny:
        return [("decode, 4 seqs at 100", [(100, 1)] * 4, 2), ("decode, 1 seq at 300", [(300, 1)], 2)]
    return [
        ("decode, 16 seqs at 190", [(190, 1)] * 16, 6),
        ("decode, 16 seqs at 1000", [(1000, 1)] * 16, 4),
        ("decode, 1 seq at 1000", [(1000, 1)], 20),
        ("decode, 1 seq at 4000", [(4000, 1)], 20),
        ("prefill, 512 tokens after 1000", [(1000, 512)], 2),
    ]


def quality_rows(dtype: str, root: Path) -> list[str]:
    rows = []
    for pool in POOLS:
        manifest = ortinf.export(DEMO_LLAMA, root / f"demo-{pool}", dtype=dtype, kv_dtype=pool, progress=False,
                                 quality_gate="record", overwrite=True)
        q = manifest.quality
        figures = ("-", "-", "-") if q is None else (f"{q.top1_agreement:.3f}", f"{q.mean_kl:.5f}", f"{q.greedy_agreement:.3f}")
        rows.append(f"| demo llama {dtype}, {pool} pool | {manifest.cpu_kernel.max_abs_diff:.3g} | " + " | ".join(figures) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="toy", help="the speed rows' model shape (compare.py's)")
    parser.add_argument("--dtype", choices=("fp32", "int8", "int4"), default="int8", help="weights of every package (default int8)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per pool (default 3)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model, few repeats (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="keep the model and packages here between runs (default: a temporary folder)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.work_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        lines = [f"### KV cache dtype on the CPU kernel graph: fp16 vs int8 pool, {args.dtype} weights", "",
                 f"CPU: {machine()}; {THREADS} threads.", "",
                 "Quality (the export's own figures against fp32 PyTorch; greedy agreement over 32 tokens):", "",
                 "| package | CPU graph max abs logit diff | top-1 | KL | greedy |", "|---|---:|---:|---:|---:|",
                 *quality_rows(args.dtype, root)]
        shape = TINY if args.tiny else SIZES[args.size].config
        if not (root / "hf" / "config.json").exists():
            build(root / "hf", **shape, max_position_embeddings=8192)
        steps = None
        for pool in POOLS:
            if (root / pool / "ortinf.json").exists():
                manifest = Manifest.load(root / pool)  # kept from an earlier run (--work-dir)
            else:
                manifest = ortinf.export(root / "hf", root / pool, dtype=args.dtype, kv_dtype=pool, progress=False,
                                         quality_gate="record")
            if steps is None:
                steps = []
                for name, lengths, repeats in cases(args.tiny):
                    order = rng.permutation(sum(-(-(c + n) // BLOCK_SIZE) for c, n in lengths) + 8).tolist()
                    chunks = []
                    for cached, new in lengths:  # blocks shuffled over the pool, as a long-running server leaves them
                        count = -(-(cached + new) // BLOCK_SIZE)
                        chunks.append(SequenceChunk(rng.integers(0, manifest.decoder.vocab_size, new).tolist(), cached, order[:count]))
                        del order[:count]
                    steps.append((name, build_model_input(chunks, BLOCK_SIZE), repeats, len(order) + sum(len(c.block_table) for c in chunks)))
        num_blocks = max(blocks for *_, blocks in steps)
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(1 if args.tiny else args.rounds):
            for pool in POOLS:
                graph = DecoderGraph(root / pool, num_blocks=num_blocks, block_size=BLOCK_SIZE, provider="cpu",
                                     intra_op_threads=THREADS, cpu_kernel=True)
                for name, model_input, repeats, _ in steps:
                    times.setdefault((name, pool), []).extend(time_ms(graph, model_input, repeats))
                del graph
                gc.collect()
        label = "tiny 2-layer llama" if args.tiny else SIZES[args.size].label
        lines += ["", f"Speed: one graph call, {label} at {args.dtype}, medians over {args.rounds} alternating rounds:", "",
                  "| step | fp16 pool ms | int8 pool ms | int8 speed-up |", "|---|---:|---:|---:|"]
        for name, *_ in steps:
            half, eight = statistics.median(times[name, "fp16"]), statistics.median(times[name, "int8"])
            lines.append(f"| {name} | {half:.2f} | {eight:.2f} | {half / eight:.2f}x |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
