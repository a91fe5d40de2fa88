"""Serving benchmark: `ortinf serve` with the 33.6M llama, `ortinf bench serve` at concurrency 1, 8, 32, 64.

usage: .venv/bin/python benchmarks/serve.py [--record] [--tiny]

Prompts of 128 random tokens, 128 output tokens each (ignore_eos, greedy), 2 ORT threads, all on this
machine; the load generator runs in this process beside the server process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_llama import TINY, build, report

import ortinf
from ortinf.cli.bench import BenchConfig, run_bench

LEVELS = (1, 8, 32, 64)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="2-layer model, concurrency 1 and 4, 16 tokens (smoke test)")
    args = parser.parse_args()
    levels, length, vocab = ((1, 4), 16, TINY["vocab_size"]) if args.tiny else (LEVELS, 128, 8192)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root / "hf", **(TINY if args.tiny else {}))
        ortinf.export(root / "hf", root / "pkg", progress=False)
        port = free_port()
        ortinf_bin = str(Path(sys.executable).with_name("ortinf"))
        server = subprocess.Popen([ortinf_bin, "serve", str(root / "pkg"), "--port", str(port), "--max-num-seqs", "64",
                                   "--intra-op-threads", "2", "--log-level", "warning"], env=os.environ.copy())
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.2)
            summaries = []
            for concurrency in levels:
                config = BenchConfig(url, None, max(8, 2 * concurrency), length, length, concurrency, vocab_size=vocab)
                summary = asyncio.run(run_bench(config))
                summaries.append(summary)
                print(json.dumps({k: summary[k] for k in ("completed", "failed", "output_throughput")} | {"concurrency": concurrency}), flush=True)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    lines = [
        "### Serving: `ortinf bench serve`, 33.6M llama fp32, 128 in / 128 out, 2 threads, one machine",
        "",
        "| concurrency | requests | req/s | output tok/s | TTFT mean / p99 ms | TPOT mean ms | ITL mean / p99 ms | E2E mean / p99 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for concurrency, s in zip(levels, summaries):
        lines.append(
            f"| {concurrency} | {s['completed']} | {s['request_throughput']:.2f} | {s['output_throughput']:,.0f} | "
            f"{s['ttft_ms']['mean']:,.0f} / {s['ttft_ms']['p99']:,.0f} | {s['tpot_ms']['mean']:.1f} | "
            f"{s['itl_ms']['mean']:.1f} / {s['itl_ms']['p99']:.1f} | {s['e2el_ms']['mean']:,.0f} / {s['e2el_ms']['p99']:,.0f} |"
        )
    text = "\n".join(lines) + "\n"
    report(text, args.record)


if __name__ == "__main__":
    main()
