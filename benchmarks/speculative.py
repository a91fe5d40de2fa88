"""Speculative decoding: latency with and without it, one request at a time and 8 at once. N-gram
lookup on the bundled demo model (it writes Python, where lookup hits often) and on a random-weight
model of the same shape and tokenizer (whose greedy output falls into loops, which lookup predicts);
a draft model on the demo: the demo's own int4 export (same tokenizer, cheaper weights).

usage: .venv/bin/python benchmarks/speculative.py [--tokens 128] [--k 4] [--record]

Greedy, 8 Python prompts, 128 new tokens each, 2 threads, prefix caching off; "off" and "on" runs
alternate twice and the table gives medians. TPOT is (finish - first token) / (tokens - 1) per
request, averaged. Every "on" run must give the tokens of the "off" run (checked).
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date
from pathlib import Path

import onnxruntime
from demo_tokenizer_models import random_llama
from record import finish

from ortinf.bundled import DEMO_LLAMA, ensure_exported
from ortinf.config import EngineConfig
from ortinf.matrix import machine
from ortinf.runtime.engine.llm_engine import LLMEngine
from ortinf.runtime.sample.sampling_params import SamplingParams

PROMPTS = [
    "def read_config(path):\n", "class LRUCache:\n    def __init__(self, capacity):\n", "import os\n\ndef walk(root):\n",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser()\n", "def merge_sort(items):\n",
    "class Stack:\n    def push(self, item):\n", "def download(url, path):\n    with open(path, 'wb') as f:\n",
    "def fibonacci(n):\n    if n < 2:\n",
]


def int4_package(work: Path) -> Path:
    """The demo exported at int4, as a draft for the fp32 demo."""
    package = work / "demo-int4"
    if not (package / "ortinf.json").is_file():
        import ortinf

        ortinf.export(DEMO_LLAMA, package, dtype="int4", progress=True)
    return package


def run(package: Path, concurrency: int, tokens: int, spec: dict | None, threads: int) -> tuple[dict, list[list[int]]]:
    engine = LLMEngine(EngineConfig(package_dir=package, intra_op_threads=threads, enable_prefix_caching=False, speculative_config=spec))
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    engine.add_request("def warm():\n", SamplingParams(max_tokens=4, temperature=0))
    while engine.has_unfinished_requests():
        engine.step()
    outputs, tpots = {}, []
    start = time.perf_counter()
    for batch in range(0, len(PROMPTS), concurrency):
        ids = [engine.add_request(p, params) for p in PROMPTS[batch : batch + concurrency]]
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    outputs[out.request_id] = out
                    m = out.metrics
                    tpots.append((m.finished_time - m.first_token_time) / (len(out.outputs[0].token_ids) - 1) * 1e3)
        assert all(i in outputs for i in ids)
    elapsed = time.perf_counter() - start
    stats = engine.scheduler.spec_stats
    row = {"tok/s": len(PROMPTS) * tokens / elapsed, "tpot": statistics.mean(tpots), "acceptance": stats.acceptance_rate,
           "per_draft": stats.num_accepted_tokens / stats.num_drafts if stats.num_drafts else 0.0,
           "positions": stats.accepted_per_position, "drafts": stats.num_drafts}
    order = sorted(outputs, key=lambda i: int(i))
    return row, [outputs[i].outputs[0].token_ids for i in order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--lookup-max", type=int, default=4, help="prompt_lookup_max")
    parser.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    parser.add_argument("--passes", type=int, default=2, help="interleaved off/on passes")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/ortinf-speculative"), help="where the random model is built")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="the demo with n-gram lookup only, 8 tokens, one pass (smoke test)")
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    ngram = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": args.lookup_max}
    demo = dict(ensure_exported(progress=True))["ortinf-demo-llama"]
    if args.tiny:
        args.tokens, args.passes = 8, 1
    draft = {"model": str(int4_package(args.work_dir)), "num_speculative_tokens": args.k} if not args.tiny else None
    cases = {"demo (trained, Python), n-gram": (demo, ngram)} if args.tiny else {
        "demo (trained, Python), n-gram": (demo, ngram),
        "random weights, same shape, n-gram": (random_llama(args.work_dir, "random-demo-shape"), ngram),
        "demo, draft model: the demo at int4": (demo, draft)}
    lines = [
        f"### Speculative decoding, n-gram lookup and a draft model ({date.today()}, {machine()}, onnxruntime {onnxruntime.__version__})",
        "",
        f"Greedy, 8 Python prompts x {args.tokens} new tokens, {args.threads} threads, k={args.k}, prompt_lookup_max={args.lookup_max}; "
        f"medians of {args.passes} interleaved passes. Output tokens identical with and without speculation (checked).",
        "",
        "| model, method | requests at once | tok/s off | tok/s on | speed-up | TPOT ms off | TPOT ms on | acceptance "
        "| accepted per draft | accepted by position |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, (package, spec) in cases.items():
        for concurrency in (1,) if args.tiny else (1, 8):
            rows: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(args.passes):
                off, off_tokens = run(package, concurrency, args.tokens, None, args.threads)
                on, on_tokens = run(package, concurrency, args.tokens, spec, args.threads)
                assert on_tokens == off_tokens, f"{name}: speculation changed the greedy output"
                rows[False].append(off)
                rows[True].append(on)
            med = {k: {f: statistics.median(r[f] for r in v) for f in ("tok/s", "tpot", "acceptance", "per_draft")} for k, v in rows.items()}
            positions = rows[True][-1]["positions"]
            drafts = rows[True][-1]["drafts"] or 1
            lines.append(f"| {name} | {concurrency} | {med[False]['tok/s']:.0f} | {med[True]['tok/s']:.0f} | "
                         f"{med[True]['tok/s'] / med[False]['tok/s']:.2f}x | {med[False]['tpot']:.1f} | {med[True]['tpot']:.1f} | "
                         f"{med[True]['acceptance']:.0%} | {med[True]['per_draft']:.2f} | "
                         f"{' / '.join(f'{c / drafts:.0%}' for c in positions)} |")
            print(lines[-1], flush=True)
    finish(lines, args.record)


if __name__ == "__main__":
    main()
