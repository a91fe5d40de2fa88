"""What benchmarks/compare.py hands each engine runner, and what the runner hands back.

Every runner (benchmarks/peers/run_*.py) runs in its engine's own virtual environment, so this
module needs only the standard library. A runner is called as

    <venv>/bin/python benchmarks/peers/run_<engine>.py JOB.json RESULT.json

JOB.json: {"hf_dir", "work_dir", "precision", "prompts": [[ids]], "new_tokens", "threads",
"mode": "batch" | "single"}. "batch" submits every prompt at once (as the engine batches best:
continuous batching, or one padded batch); "single" runs the prompts one after another.
The runner converts the model into work_dir (cached between runs), warms up, and times the run.

RESULT.json: {"engine", "precision", "tokens": [[ids]] (greedy, new_tokens each, no EOS stop),
"seconds" (wall time of the timed run), "ttft": [s] and "tpot": [s] per prompt, and "conversion_seconds":
the wall time of the model's conversion, measured when it ran and recorded beside its output, or
null when the conversion predates the record}: TTFT from the
prompt's submission (the run's start in batch mode, its own start in single mode) to its first
token; TPOT = (last token time - first token time) / (new_tokens - 1).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path


def load_job() -> dict:
    return json.loads(Path(sys.argv[1]).read_text())


def write_result(job: dict, engine: str, tokens: list[list[int]], seconds: float, ttft: list[float], tpot: list[float],
                 **extra: object) -> None:
    assert all(len(t) == job["new_tokens"] for t in tokens), [len(t) for t in tokens]
    result = {"engine": engine, "precision": job["precision"], "tokens": tokens, "seconds": seconds, "ttft": ttft, "tpot": tpot,
              "conversion_seconds": job.get("conversion_seconds"), **extra}
    Path(sys.argv[2]).write_text(json.dumps(result))


def one_at_a_time(job: dict, generate: Callable[[list[int]], tuple[list[int], float, float]]) -> tuple:
    """Runs `generate(prompt) -> (tokens, first_token_time, last_token_time)` per prompt in turn;
    returns (tokens, seconds, ttft, tpot) as write_result takes them."""
    tokens, ttft, tpot = [], [], []
    begin = time.monotonic()
    for prompt in job["prompts"]:
        start = time.monotonic()
        out, first, last = generate(prompt)
        tokens.append(out)
        ttft.append(first - start)
        tpot.append((last - first) / max(len(out) - 1, 1))
    return tokens, time.monotonic() - begin, ttft, tpot


def conversion(record: Path, needed: bool, convert: Callable[[], object]) -> float | None:
    """Runs `convert` when `needed` (its output is missing), timing it into `record`; returns the
    recorded seconds (a cached conversion reports the time it took when it ran), or None."""
    if needed:
        start = time.monotonic()
        convert()
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(f"{time.monotonic() - start:.1f}")
    return float(record.read_text()) if record.exists() else None
