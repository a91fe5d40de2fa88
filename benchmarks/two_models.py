"""Two models in one process: does a second ORT session slow the decoder down?

usage: .venv/bin/python benchmarks/two_models.py [--record] [--tiny]

The default `ortinf serve` holds the bundled demo llama and all-MiniLM-L6-v2. Each ORT session owns
an intra-op thread pool whose threads spin after a call, and on a 2-core machine the encoder's
spinning threads stole the decoder's cores. Now only the engine's decoder spins; encoder and draft
sessions do not (ortinf/providers/session.py, create_session's `spin`).

Table 1, one graph call: the demo's 32-sequence decode step at context 190, alone and with MiniLM's
session beside it (an embedding call every fifth step), with the encoder not spinning (now) and
spinning (before); each case in a fresh process.
Table 2, the real servers: `ortinf bench serve` against the demo (16 at once, 64 in / 64 out) on a
single-model server and on the default two-model server while a client asks for an embedding every
50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ray_serve import free_port, wait_healthy
from record import finish

from ortinf.bundled import ensure_exported
from ortinf.cli.bench import BenchConfig, run_bench
from ortinf.matrix import machine

STEP = r"""
import json, statistics, sys, time
from pathlib import Path
import numpy as np
from ortinf.runtime.worker import encoder_graph
if sys.argv[3] == "spinning":  # the old behaviour: the encoder's threads spin too
    create = encoder_graph.create_session
    encoder_graph.create_session = lambda *a, spin=True, **k: create(*a, spin=True, **k)
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.encoder_graph import EncoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input
graph = DecoderGraph(Path(sys.argv[1]), num_blocks=512, block_size=16, provider="cpu", intra_op_threads=2)
order = np.random.default_rng(0).permutation(500).tolist()
step = build_model_input([SequenceChunk([5], 190, order[i * 12:(i + 1) * 12]) for i in range(32)], 16)
encoder = EncoderGraph(Path(sys.argv[2]), provider="cpu", intra_op_threads=2) if sys.argv[4] == "both" else None
for _ in range(3):
    graph.run(step)
times = []
for i in range(int(sys.argv[5])):
    if encoder is not None and i % 5 == 0:
        encoder.run([[101, 2023, 2003, 1037, 6251, 102]])
    start = time.perf_counter()
    graph.run(step)
    times.append((time.perf_counter() - start) * 1e3)
print(json.dumps(statistics.median(times)))
"""


def step_ms(llama: Path, minilm: Path, pools: str, models: str, steps: int) -> float:
    done = subprocess.run([sys.executable, "-c", STEP, str(llama), str(minilm), pools, models, str(steps)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def serve(args: list[str], num_prompts: int, length: int, embeddings: bool) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(Path(sys.executable).with_name("ortinf")), "serve", *args, "--port", str(port),
                               "--intra-op-threads", "2", "--log-level", "warning", "--kv-cache-memory", "256MiB"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    stop = threading.Event()
    asked = []

    def embed() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "read a file"}).raise_for_status()
                asked.append(1)
                time.sleep(0.05)

    try:
        wait_healthy(url, server, args)
        worker = threading.Thread(target=embed, daemon=True)
        if embeddings:
            worker.start()
        summary = asyncio.run(run_bench(BenchConfig(url, "ortinf-demo-llama", num_prompts, length, length, 16, vocab_size=8192)))
        stop.set()
        if embeddings:
            worker.join(60)
        return summary | {"embeddings": len(asked)}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="few steps and requests (smoke test)")
    args = parser.parse_args()
    steps, num_prompts, length = (6, 8, 8) if args.tiny else (60, 64, 64)
    bundled = dict(ensure_exported(progress=False))
    llama, minilm = bundled["ortinf-demo-llama"], bundled["all-MiniLM-L6-v2"]
    lines = [f"### Two models in one process ({time.strftime('%Y-%m-%d')}, {machine()})", "",
             "The demo llama's decode step (32 sequences at context 190, 2 threads), ms, median of "
             f"{steps}; every case in a fresh process, the cases interleaved twice.", "",
             "| encoder session | demo llama alone | with MiniLM's session (an embedding every 5th step) |", "|---|---:|---:|"]
    cells: dict[tuple[str, str], list[float]] = {}
    for _ in range(1 if args.tiny else 2):
        for pools in ("quiet", "spinning"):
            for models in ("alone", "both"):
                cells.setdefault((pools, models), []).append(step_ms(llama, minilm, pools, models, steps))
    for pools, label in (("quiet", "the encoder's threads do not spin (now)"), ("spinning", "the encoder's threads spin (before)")):
        lines.append(f"| {label} | {statistics.median(cells[pools, 'alone']):.1f} | {statistics.median(cells[pools, 'both']):.1f} |")
    lines += ["", f"`ortinf bench serve` against the demo: {num_prompts} requests, {length} in / {length} out, 16 at once.", "",
              "| server | output tok/s | TPOT mean ms | embeddings answered meanwhile |", "|---|---:|---:|---:|"]
    for name, server_args, embeddings in (("demo llama alone", [str(llama), "--served-model-name", "ortinf-demo-llama"], False),
                                          ("default: demo llama + MiniLM, embeddings every 50 ms", [], True)):
        s = serve(server_args, num_prompts, length, embeddings)
        lines.append(f"| {name} | {s['output_throughput']:,.0f} | {s['tpot_ms']['mean']:.1f} | {s['embeddings'] if embeddings else '-'} |")
        print(lines[-1], flush=True)
    finish(lines, args.record)


if __name__ == "__main__":
    main()
