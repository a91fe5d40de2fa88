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
null when the conversion predates the record, "conversion_peak_gib": the conversion's peak RSS (it runs in a
forked child, whose ru_maxrss wait4 reports, its own children included), "load_seconds": the time to open the
converted model and be ready to generate, and in single mode "ttft_long": the first-token time of
job["long_prompt"] (512 tokens) when the job has one}: TTFT from the
prompt's submission (the run's start in batch mode, its own start in single mode) to its first
token; TPOT = (last token time - first token time) / (new_tokens - 1).
"""

from __future__ import annotations

import json
import os
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
              "conversion_seconds": job.get("conversion_seconds"), "conversion_peak_gib": job.get("conversion_peak_gib"),
              "load_seconds": job.get("load_seconds"), "ttft_long": job.get("ttft_long"), "package_bytes": job.get("package_bytes"),
              **extra}
    Path(sys.argv[2]).write_text(json.dumps(result))


def loading(job: dict, load: Callable[[], object]) -> object:
    """`load()`, timed into job["load_seconds"]: opening the converted model until it can generate."""
    start = time.monotonic()
    loaded = load()
    job["load_seconds"] = time.monotonic() - start
    return loaded


def one_at_a_time(job: dict, generate: Callable[[list[int]], tuple[list[int], float, float]]) -> tuple:
    """Runs `generate(prompt) -> (tokens, first_token_time, last_token_time)` per prompt in turn;
    returns (tokens, seconds, ttft, tpot) as write_result takes them. A job with a "long_prompt" runs it first,
    on its own, for job["ttft_long"] (its tokens are not part of the result)."""
    if job.get("long_prompt"):
        start = time.monotonic()
        _, first, _ = generate(job["long_prompt"])
        job["ttft_long"] = first - start
    tokens, ttft, tpot = [], [], []
    begin = time.monotonic()
    for prompt in job["prompts"]:
        start = time.monotonic()
        out, first, last = generate(prompt)
        tokens.append(out)
        ttft.append(first - start)
        tpot.append((last - first) / max(len(out) - 1, 1))
    return tokens, time.monotonic() - begin, ttft, tpot


def conversion(record: Path, needed: bool, convert: Callable[[], object], job: dict | None = None) -> float | None:
    """Runs `convert` when `needed` (its output is missing) in a forked child, timing it and taking its peak RSS
    (wait4's ru_maxrss: the child's, its own children included) into `record`; returns the recorded seconds (a
    cached conversion reports what it took when it ran), or None; with `job`, also sets job["conversion_peak_gib"]."""
    if needed:
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child converts and leaves without the parent's exit handlers
            code = 1
            try:
                convert()
                code = 0
            except BaseException:  # noqa: BLE001 - reported by the exit code; the traceback is on stderr
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status, usage = os.wait4(pid, 0)
        if os.WIFSIGNALED(status):
            raise RuntimeError(f"conversion killed by signal {os.WTERMSIG(status)} (9: out of memory) at "
                               f"{usage.ru_maxrss / 2**20:.1f} GiB after {time.monotonic() - start:.0f} s")
        if os.WEXITSTATUS(status) != 0:  # a converter the OOM killer took shows as its caller's error: the peak says
            raise RuntimeError(f"conversion failed (exit {os.WEXITSTATUS(status)}) at {usage.ru_maxrss / 2**20:.1f} GiB peak RSS "
                               f"after {time.monotonic() - start:.0f} s")
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"seconds": round(time.monotonic() - start, 1), "peak_gib": round(usage.ru_maxrss / 2**20, 2)}))
    if not record.exists():
        return None
    text = record.read_text()
    found = json.loads(text) if text.lstrip().startswith("{") else {"seconds": float(text)}  # older records: seconds only
    if job is not None:
        peaks = [p for p in (job.get("conversion_peak_gib"), found.get("peak_gib")) if p is not None]
        job["conversion_peak_gib"] = max(peaks) if peaks else None
    return found["seconds"]
