"""Time of one graph call of the portable kernel on the 33.6M llama (fp32, 2 intra-op threads).

usage: .venv/bin/python benchmarks/decode_step.py [--record]

Measures the shapes the engine benchmark will hit: a 32-sequence decode step at context 190, a
batch-1 decode at context 190, a 32 x 126-token prefill, and one mixed step (a 256-token prefill
chunk beside 31 decodes, where the padded layout costs most). Figures are medians over repeats;
"graph ms" is ORT's run alone, "ms per call" adds the numpy K/V write into the pool (the difference
is within the noise). --record appends to RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import ortinf
from ortinf.runtime.decoder_graph import DecoderGraph
from ortinf.runtime.model_input import SequenceChunk, build_model_input

BLOCK_SIZE = 16


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def chunks_for(lengths: list[tuple[int, int]], rng: np.random.Generator, vocab: int) -> list[SequenceChunk]:
    """(num_computed, num_new) per sequence; each sequence gets its own run of blocks."""
    chunks, next_block = [], 0
    for computed, new in lengths:
        count = -(-(computed + new) // BLOCK_SIZE)
        chunks.append(SequenceChunk(rng.integers(0, vocab, new).tolist(), computed, list(range(next_block, next_block + count))))
        next_block += count
    return chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    import sys

    sys.path.insert(0, str(Path(__file__).with_name("export_llama.py").parent))
    from export_llama import build, report

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp) / "hf")
        ortinf.export(Path(tmp) / "hf", Path(tmp) / "pkg", progress=False)
        graph = DecoderGraph(Path(tmp) / "pkg", num_blocks=512, block_size=BLOCK_SIZE, provider="cpu", intra_op_threads=2)
        vocab = graph.spec.vocab_size
        cases = [
            ("decode, 32 seqs at context 190", [(190, 1)] * 32, 20),
            ("decode, 1 seq at context 190", [(190, 1)], 50),
            ("prefill, 32 x 126 tokens", [(0, 126)] * 32, 3),
            ("mixed: 256-token chunk + 31 decodes", [(0, 256)] + [(190, 1)] * 31, 5),
        ]
        rows = []
        for name, lengths, repeats in cases:
            model_input = build_model_input(chunks_for(lengths, rng, vocab), BLOCK_SIZE)
            feeds = {**model_input.feeds(), **graph._cache_feeds}
            total = median_ms(lambda: graph.run(model_input), repeats)
            run_only = median_ms(lambda: graph.session.run(None, feeds), repeats)
            tokens = int(model_input.query_lens.sum())
            rows.append((name, tokens, total, run_only, tokens / total * 1e3))
    table = ["| step | tokens | ms per call | graph ms | tokens/s |", "|---|---:|---:|---:|---:|"]
    table += [f"| {n} | {t} | {a:.1f} | {g:.1f} | {r:,.0f} |" for n, t, a, g, r in rows]
    text = "\n".join(["### One graph call, portable kernel, 33.6M llama fp32, 2 threads", "", *table, ""])
    report(text, args.record)


if __name__ == "__main__":
    main()
