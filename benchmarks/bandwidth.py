"""The machine's streaming read bandwidth with N threads: each thread sums its own 256 MiB buffer
(far larger than any cache), best of 5; numpy releases the GIL inside the reduction.

usage: .venv/bin/python benchmarks/bandwidth.py [THREADS]
"""

from __future__ import annotations

import sys
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


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    print(f"{measure(n) / 1e9:.1f} GB/s with {n} threads")
