"""Per-step cost of structured output: 32 concurrent requests decoding under a JSON schema against the
same 32 unconstrained, on the bundled demo model (6.8M parameters: a 10 ms decode step, so the
grammar's share is large) and on the engine benchmark's 33.6M llama (random weights) with the demo's
tokenizer (same vocabulary, 8,192).

usage: .venv/bin/python benchmarks/structured_output.py [--requests 32] [--tokens 48] [--record] [--tiny]

Each run adds the requests, lets every prompt finish prefilling, then times each decode step
(engine.step()); unconstrained and constrained runs alternate three times and the table gives
medians. "mask fill" is llguidance filling the step's 32 masks, in the worker thread that runs
beside the graph (its CPU time competes with ORT's threads on 2 cores). Two schemas: free-form
strings (inside a string almost every token is allowed: llguidance's costliest case) and typed
fields (integers, booleans, enums). Neither can be complete within the token budget (minItems 40),
so every step has all rows constrained.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date
from pathlib import Path

import onnxruntime
from demo_tokenizer_models import LLAMA_33M, random_llama
from record import finish

from ortinf.bundled import ensure_exported
from ortinf.config import EngineConfig
from ortinf.matrix import machine
from ortinf.runtime.engine.llm_engine import LLMEngine
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.sample.structured_output import StructuredOutput

STRINGS = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}, "minItems": 40}},
           "required": ["items"], "additionalProperties": False}
TYPED = {"type": "array", "minItems": 40, "items": {
    "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999}, "ok": {"type": "boolean"},
                                     "kind": {"enum": ["read", "write", "delete"]}},
    "required": ["id", "ok", "kind"], "additionalProperties": False}}
SCHEMAS = {"free-form strings": STRINGS, "typed fields": TYPED}


def decode_steps(engine: LLMEngine, requests: int, tokens: int, schema: dict | None) -> list[float]:
    output = StructuredOutput.json_schema(schema) if schema is not None else None
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


def measure(package: Path, args) -> list[str]:
    engine = LLMEngine(EngineConfig(package_dir=package, intra_op_threads=args.threads, enable_prefix_caching=False,
                                    max_num_seqs=args.requests))
    fills: list[float] = []
    fill = engine.grammars.fill_masks

    def timed(matchers):
        start = time.perf_counter()
        masks = fill(matchers)
        fills.append((time.perf_counter() - start) * 1e3)
        return masks

    engine.grammars.fill_masks = timed
    for schema in SCHEMAS.values():
        decode_steps(engine, 4, 8, schema)  # warm-up (each grammar compiled once, as the server's cache does)
    runs: dict[str, list[float]] = {name: [] for name in ["unconstrained", *SCHEMAS]}
    fill_by_schema: dict[str, list[float]] = {name: [] for name in SCHEMAS}
    for _ in range(3):
        runs["unconstrained"] += decode_steps(engine, args.requests, args.tokens, None)
        for name, schema in SCHEMAS.items():
            fills.clear()
            runs[name] += decode_steps(engine, args.requests, args.tokens, schema)
            fill_by_schema[name] += fills[-args.tokens + 2:]
    plain = statistics.median(runs["unconstrained"])
    rows = [f"| {package.name} | unconstrained | {plain:.1f} | | |"]
    for name in SCHEMAS:
        guided = statistics.median(runs[name])
        rows.append(f"| {package.name} | JSON schema, {name} | {guided:.1f} | {statistics.median(fill_by_schema[name]):.2f} | "
                    f"{guided - plain:+.1f} ms ({(guided / plain - 1) * 100:+.0f}%) |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32, help="concurrent requests")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per request")
    parser.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/ortinf-structured"), help="where the 33.6M llama is built")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="the demo model only, 4 requests x 8 tokens (smoke test)")
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    packages = [dict(ensure_exported(progress=True))["ortinf-demo-llama"]]
    if args.tiny:
        args.requests, args.tokens = 4, 8
    else:
        packages.append(random_llama(args.work_dir, "llama33m-demo-tokenizer", LLAMA_33M))
    lines = [
        f"### Structured output, per decode step ({date.today()}, {machine()}, onnxruntime {onnxruntime.__version__})",
        "",
        f"fp32, {args.requests} concurrent requests, {args.tokens} tokens each, sampled (temperature 1), {args.threads} threads; "
        "medians over 3 interleaved runs of each kind. The bundled demo llama (6.8M parameters) and the engine benchmark's "
        "33.6M llama (random weights) with the demo's tokenizer; vocabulary 8,192 for both.",
        "",
        "| model | requests decode under | step ms | mask fill ms (worker thread) | cost per step |",
        "|---|---|---:|---:|---:|",
    ]
    for package in packages:
        lines += measure(package, args)
    finish(lines, args.record)


if __name__ == "__main__":
    main()
