"""The machine's streaming read bandwidth with N threads: each thread sums its own 256 MiB buffer
(far larger than any cache), best of 5; numpy releases the GIL inside the reduction.

usage: .venv/bin/python benchmarks/bandwidth.py [--tiny] [--record]
"""

from __future__ import annotations

import threading
import time

import numpy as np


def measure(threads: int = 2, mib: int = 256, repeats: int = 5) -> float:
    """Bytes per second read by `threads` threads at once."""
    buffers = [np.ones(mib * 2**20 // 8, dtype=np.int64) for _ in range(threads)]
    best = 0.0
    for _ in range(repeats):
        workers = [threading.Thread(target=np.add.reduce, args=(b,)) for b in buffers]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, threads * mib * 2**20 / (time.perf_counter() - start))
    return best


def main() -> None:
    import argparse

    from record import finish

    from ortinf.matrix import machine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="16 MiB buffers, one round (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    rows = [(n, measure(n, 16, 1) if args.tiny else measure(n)) for n in (1, 2)]
    finish([f"### Streaming read bandwidth ({time.strftime('%Y-%m-%d')})", "", f"Machine: {machine()}", "",
            "| threads | GB/s |", "|---:|---:|", *(f"| {n} | {rate / 1e9:.1f} |" for n, rate in rows)], args.record)


if __name__ == "__main__":
    main()
