"""The machine's streaming read bandwidth with N threads: each thread sums its own 256 MiB buffer
(far larger than any cache), best of 5; numpy releases the GIL inside the reduction.

usage: .venv/bin/python benchmarks/bandwidth.py [--threads N] [--tiny]
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


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="threads reading at once")
    parser.add_argument("--tiny", action="store_true", help="16 MiB buffers, one round (smoke test)")
    args = parser.parse_args()
    rate = measure(args.threads, 16, 1) if args.tiny else measure(args.threads)
    print(f"{rate / 1e9:.1f} GB/s with {args.threads} threads")
