"""ortinf behind Ray Serve against the single process, on one machine: what Ray costs, not how it scales.

usage: .venv/bin/python benchmarks/ray_serve.py [--record] [--tiny]   (needs the ray extra: pip install 'ortinf[ray]')

The bundled demo llama; `ortinf bench serve` (32 requests, 64 random tokens in, 64 out, 8 at once),
then 40 sequential one-token requests whose median latency is the per-request cost of the path
(HTTP, Ray's proxy and router, the replica). Rows: the single process with 2 and with 1 ORT threads,
Ray with 1 replica (1 thread) and with 2 replicas (1 thread each) on this 2-core machine. One
machine can show Ray's overhead and its routing, not scale-out: the 2-replica row shares the same
two cores.

A second table routes a shared-prefix workload (8 system prompts of ~400 tokens, 6 users each, in
turn) through 2 replicas with Ray's default router and with `--prefix-routing`: the requests that
missed the prefix cache, the cached share of prompt tokens, and the mean time to the whole
(4-token) answer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import httpx
from record import finish

from ortinf.bundled import ensure_exported
from ortinf.cli.bench import BenchConfig, run_bench
from ortinf.matrix import machine

ROWS = [("single process, 2 threads", ["--intra-op-threads", "2"]),
        ("single process, 1 thread", ["--intra-op-threads", "1"]),
        ("Ray Serve, 1 replica x 1 thread", ["--ray", "--num-replicas", "1", "--cpus-per-replica", "1", "--intra-op-threads", "1"]),
        ("Ray Serve, 2 replicas x 1 thread", ["--ray", "--num-replicas", "2", "--cpus-per-replica", "1", "--intra-op-threads", "1"])]


def wait_healthy(url: str, server: subprocess.Popen, what: object, seconds: float = 300) -> float:
    """Waits for `url`'s /health to answer 200; returns the seconds it took. SystemExit when the
    server dies or is not up in time."""
    start = time.monotonic()
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        if time.monotonic() - start > seconds or server.poll() is not None:
            raise SystemExit(f"the server did not start: {what}")
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SYSTEM = "You are a careful Python reviewer. Explain each change, cite the line, and prefer the standard library. " * 5


def shared_prefix(url: str) -> dict:
    misses, cached, prompt, times = 0, 0, 0, []
    with httpx.Client(base_url=url, timeout=120) as client:
        for user in range(6):
            for system in range(8):
                body = {"prompt": f"# system {system}\n{SYSTEM}\n# user {user}\ndef task_{user}_{system}():\n", "max_tokens": 4}
                start = time.perf_counter()
                usage = client.post("/v1/completions", json=body).raise_for_status().json()["usage"]
                times.append((time.perf_counter() - start) * 1e3)
                hit = usage["prompt_tokens_details"]["cached_tokens"]
                misses += hit == 0
                cached += hit
                prompt += usage["prompt_tokens"]
    return {"misses": misses, "requests": 48, "hit_rate": cached / prompt, "latency_ms": statistics.mean(times)}


BENCH = dict(num_prompts=32, length=64, one_token=40)


def measure(package: Path, extra: list[str], workload=None) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": "local"}
    server = subprocess.Popen([str(Path(sys.executable).with_name("ortinf")), "serve", str(package), "--port", str(port),
                               "--log-level", "warning", "--kv-cache-memory", "256MiB", *extra],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ready = wait_healthy(url, server, extra)
        if workload is not None:
            time.sleep(3)  # the front learns of every replica
            return workload(url)
        summary = asyncio.run(run_bench(BenchConfig(url, None, BENCH["num_prompts"], BENCH["length"], BENCH["length"], 8, vocab_size=8192)))
        one = []
        with httpx.Client(base_url=url, timeout=60) as client:
            for i in range(BENCH["one_token"]):
                t = time.perf_counter()
                client.post("/v1/completions", json={"prompt": [5 + i % 7] * 8, "max_tokens": 1}).raise_for_status()
                one.append((time.perf_counter() - t) * 1e3)
        return {"ready_s": ready, "summary": summary, "one_token_ms": statistics.median(one[len(one) // 8:])}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="the single process and 1 Ray replica, 8 requests, no routing table (smoke test)")
    args = parser.parse_args()
    rows = ROWS
    if args.tiny:
        BENCH.update(num_prompts=8, length=8, one_token=8)
        rows = [ROWS[0], ROWS[2]]
    package = dict(ensure_exported(progress=True))["ortinf-demo-llama"]
    lines = [
        f"### Ray Serve against the single process ({date.today()}, {machine()})",
        "",
        "Bundled demo llama fp32; `ortinf bench serve`: 32 requests, 64 random tokens in / 64 out, 8 at once; then 40 sequential "
        "one-token requests (median of the last 35). One machine: this shows Ray's overhead, not scale.",
        "",
        "| server | ready after s | output tok/s | TTFT mean / p99 ms | TPOT mean ms | one-token request ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, extra in rows:
        r = measure(package, extra)
        s = r["summary"]
        lines.append(f"| {name} | {r['ready_s']:.1f} | {s['output_throughput']:,.0f} | {s['ttft_ms']['mean']:,.0f} / {s['ttft_ms']['p99']:,.0f} | "
                     f"{s['tpot_ms']['mean']:.1f} | {r['one_token_ms']:.1f} |")
        print(lines[-1], flush=True)
    if args.tiny:
        finish(lines, args.record)
        return
    lines += ["", "| 2 replicas x 1 thread, router | requests missing the prefix cache | cached share of prompt tokens | mean request ms |",
              "|---|---:|---:|---:|"]
    ray_two = ["--ray", "--num-replicas", "2", "--cpus-per-replica", "1", "--intra-op-threads", "1"]
    for name, extra in (("Ray's default (power of two choices)", ray_two), ("--prefix-routing", [*ray_two, "--prefix-routing"])):
        r = measure(package, extra, shared_prefix)
        lines.append(f"| {name} | {r['misses']} / {r['requests']} | {r['hit_rate']:.0%} | {r['latency_ms']:.1f} |")
        print(lines[-1], flush=True)
    finish(lines, args.record)


if __name__ == "__main__":
    main()
