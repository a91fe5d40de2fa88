"""The engine's output path: per-step time outside the graph call, cumulative outputs against deltas.

usage: .venv/bin/python benchmarks/output_path.py [--record] [--tiny]

A cumulative output copies a request's whole token list and logprobs every step (O(n) per step, O(n^2)
per request); a delta copies what is new. Measured on a tiny 2-layer llama (the graph call is small, so
the Python around it shows), greedy with logprobs=1, prefix caching off: one stream generating
LONG tokens, and 64 streams of SHORT tokens each; per step: the engine step's wall time minus the time
inside DecoderGraph.run (the graph call with its input binding). The two kinds run alternately,
twice; each figure is the median over both runs' steps (for the long stream: its last 1,000 steps,
where the copies are largest).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_step import cpu_flags
from export_llama import TINY, build
from record import finish

import ortinf
from ortinf.config import EngineConfig
from ortinf.runtime.engine.llm_engine import LLMEngine
from ortinf.runtime.sample.sampling_params import SamplingParams

KINDS = ("cumulative", "delta")


def overheads(package: Path, kind: str, streams: int, tokens: int, max_len: int) -> tuple[list[float], int]:
    """ms per step outside the graph call, one entry per step; and the bytes the last step allocated
    at its peak (tracemalloc, traced for that step only: a cumulative output copies the whole
    request, so this grows with the tokens so far)."""
    engine = LLMEngine(EngineConfig(package_dir=package, provider="cpu", max_num_seqs=max(streams, 1), enable_prefix_caching=False,
                                    max_model_len=max_len, kv_cache_memory=256 * 2**20, intra_op_threads=1))
    graph_time = [0.0]
    run = engine.graph.run

    def timed(model_input):
        start = time.perf_counter()
        try:
            return run(model_input)
        finally:
            graph_time[0] += time.perf_counter() - start

    engine.graph.run = timed  # type: ignore[method-assign]
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, logprobs=1)
    for i in range(streams):
        engine.add_request(engine.prepare([3 + (i + j) % 200 for j in range(8)], replace(params), output_kind=kind))
    steps, last_step_bytes = [], 0
    while engine.has_unfinished_requests():
        last = len(steps) == tokens - 1
        if last:
            tracemalloc.start()
        graph_time[0] = 0.0
        start = time.perf_counter()
        engine.step()  # the peak counts what the step allocated, even what it freed
        steps.append((time.perf_counter() - start - graph_time[0]) * 1e3)
        if last:
            last_step_bytes = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    return steps, last_step_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="short runs (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    long_tokens, short_tokens, tail = (300, 16, 100) if args.tiny else (8000, 256, 1000)
    results: dict[tuple[str, str], list[float]] = {}
    step_bytes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp) / "hf", **{**TINY, "max_position_embeddings": long_tokens + 64})
        ortinf.export(Path(tmp) / "hf", Path(tmp) / "pkg", progress=False)
        for _ in range(1 if args.tiny else 2):
            for kind in KINDS:
                one, step_bytes[kind] = overheads(Path(tmp) / "pkg", kind, 1, long_tokens, long_tokens + 64)
                results.setdefault((kind, "one"), []).extend(one[-tail:])
                many, _ = overheads(Path(tmp) / "pkg", kind, 64, short_tokens, long_tokens + 64)
                results.setdefault((kind, "many"), []).extend(many[1:])
    lines = [f"### Engine output path: ms per step outside the graph call, tiny 2-layer llama ({time.strftime('%Y-%m-%d')})", "",
             f"CPU: {platform.machine()}, {cpu_flags()}; medians.", "",
             f"| output kind | 1 stream, steps {long_tokens - tail}..{long_tokens} | 64 streams x {short_tokens} tokens "
             f"| memory one step allocates at token {long_tokens} (1 stream) |", "|---|---:|---:|---:|"]
    for kind in KINDS:
        lines.append(f"| {kind} | {statistics.median(results[kind, 'one']):.3f} | {statistics.median(results[kind, 'many']):.3f} "
                     f"| {step_bytes[kind] / 1024:.1f} KiB |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
