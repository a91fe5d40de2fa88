"""Per-step cost of structured output: 32 concurrent requests decoding under a JSON schema against the
same 32 unconstrained, on the bundled demo model (a small Llama, vocabulary 8,192: its decode step is
short, so the grammar's share is large here).

usage: .venv/bin/python benchmarks/structured_output.py [--requests 32] [--tokens 48] [--record]

Each run adds the requests, lets every prompt finish prefilling, then times each decode step
(engine.step()); the two kinds of run alternate three times and the table gives medians. "masks
alone" times llguidance filling the 32 masks without the graph beside it (in the engine they are
filled in a worker thread while the graph runs). The schema cannot be complete within the token
budget (minItems 40), so every step has all rows constrained.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date
from pathlib import Path

import onnxruntime

from ortinf.bundled import ensure_exported
from ortinf.runtime.config import EngineConfig
from ortinf.runtime.engine import LLMEngine
from ortinf.runtime.matrix import machine
from ortinf.runtime.sampling_params import SamplingParams
from ortinf.runtime.structured_output import StructuredOutput

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 40}},
          "required": ["items"], "additionalProperties": False}
RESULTS = Path(__file__).with_name("RESULTS.md")


def decode_steps(engine: LLMEngine, requests: int, tokens: int, constrained: bool) -> list[float]:
    output = StructuredOutput.json_schema(SCHEMA) if constrained else None
    for i in range(requests):
        params = SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True, structured_output=output)
        engine.add_request(f"def function_{i}(value):\n    ", params)
    times = []
    while engine.has_unfinished_requests():
        prefilling = any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running) or engine.scheduler.waiting
        start = time.perf_counter()
        engine.step()
        if not prefilling:
            times.append((time.perf_counter() - start) * 1e3)
    return times


def masks_alone(engine: LLMEngine, requests: int, repeats: int = 20) -> float:
    matchers = [engine.grammars.matcher(StructuredOutput.json_schema(SCHEMA)) for _ in range(requests)]
    for m in matchers:
        m.consume_tokens(engine.tokenizer.encode('{"items":["a', add_special_tokens=False).ids)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.grammars.fill_masks(matchers)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32, help="concurrent requests")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per request")
    parser.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    package = dict(ensure_exported(progress=True))["ortinf-demo-llama"]
    engine = LLMEngine(EngineConfig(package_dir=package, intra_op_threads=args.threads, enable_prefix_caching=False,
                                    max_num_seqs=args.requests))
    decode_steps(engine, 4, 8, True)  # warm-up (and the grammar compiled once, as the server's cache does)
    runs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(3):
        for constrained in (False, True):
            runs[constrained] += decode_steps(engine, args.requests, args.tokens, constrained)
    plain, guided = statistics.median(runs[False]), statistics.median(runs[True])
    alone = masks_alone(engine, args.requests)
    lines = [
        f"### Structured output, per decode step ({date.today()}, {machine()}, onnxruntime {onnxruntime.__version__})",
        "",
        f"Bundled demo llama (6 layers, hidden 256, vocabulary 8,192), fp32, {args.requests} concurrent requests, "
        f"{args.tokens} tokens each, {args.threads} threads; medians over 3 interleaved runs of each kind.",
        "",
        "| decode step | ms |",
        "|---|---:|",
        f"| unconstrained | {plain:.1f} |",
        f"| JSON schema on every row | {guided:.1f} |",
        f"| overhead | {guided - plain:+.1f} ({(guided / plain - 1) * 100:+.0f}%) |",
        f"| the {args.requests} masks alone (llguidance, not overlapped) | {alone:.2f} |",
        "",
    ]
    print("\n".join(lines))
    if args.record:
        with RESULTS.open("a") as f:
            f.write("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
