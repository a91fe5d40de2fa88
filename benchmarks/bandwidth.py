"""The machine's streaming read bandwidth: the rate the best read loop reaches, the roofline that qmatmul.py and
compare.py state their one-row shares against.

Each variant reads one buffer far larger than the last-level cache (1 GiB, 2 MiB aligned, transparent huge pages asked
for), split into disjoint parts, one per thread, timed barrier to barrier (the slowest thread's time): plain C over
uint64, AVX2 32-byte loads, AVX-512 64-byte loads, AVX-512 non-temporal loads (vmovntdqa), AVX-512 loads with
prefetchnta ahead (benchmarks/stream_read.c, built here with the system gcc into the temp folder and loaded with ctypes;
a benchmark helper, not part of the kernel library), and numpy's add.reduce in Python threads over the same halves (what
this probe measured until issue 57: 32.5 GB/s one run, 48.0 an hour later). Rounds interleave the variants (a noisy
neighbour on this shared VM slows a round, not a variant); each variant's figure is its best read. The probe's figure is
the best variant at 2 threads.

The cross-check: ortinf's own bf16 one-row GEMV (qmatmul.py's BMatMul at 1 row on the 1.5B projections, eight weights
read in turn, so from memory) must read no faster than the probe's figure; the output says whether it does.

usage: .venv/bin/python benchmarks/bandwidth.py [--mib 1024] [--rounds 3] [--no-check] [--tiny] [--record]
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("stream_read.c")
KINDS = {0: "plain C, 8-byte loads", 1: "AVX2, 32-byte loads", 2: "AVX-512, 64-byte loads",
         3: "AVX-512, non-temporal loads (vmovntdqa)", 4: "AVX-512, 64-byte loads + prefetchnta",
         5: "AVX-512, 64-byte loads, 4 streams per thread", 6: "AVX-512, 64-byte loads + prefetcht0"}
NUMPY = "numpy add.reduce in Python threads (the old probe)"
_library: ctypes.CDLL | None = None


def helper() -> ctypes.CDLL | None:
    """stream_read.c built (once per source text) into the temp folder and loaded; None without a C compiler."""
    global _library
    if _library is None:
        from compiled import load_c

        lib = load_c(SOURCE)
        if lib is None:
            return None
        lib.stream_alloc.restype = ctypes.c_void_p
        lib.stream_alloc.argtypes = [ctypes.c_size_t]
        lib.stream_free.argtypes = [ctypes.c_void_p]
        lib.stream_supported.argtypes = [ctypes.c_int]
        lib.stream_read.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                    ctypes.POINTER(ctypes.c_double)]
        _library = lib
    return _library


@dataclass
class Reading:
    """One variant at one thread count: its best rate and every read's, bytes per second."""

    variant: str
    threads: int
    rates: list[float]

    @property
    def best(self) -> float:
        return max(self.rates)


def _numpy_read(view: np.ndarray, threads: int) -> float:
    """Seconds for `threads` Python threads to add.reduce disjoint parts of `view` (numpy releases the GIL)."""
    parts = np.array_split(view, threads)
    workers = [threading.Thread(target=np.add.reduce, args=(part,)) for part in parts]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def probe(threads: tuple[int, ...] = (1, 2), mib: int = 1024, rounds: int = 3, reads: int = 3) -> list[Reading]:
    """Every variant at every thread count: `rounds` rounds, the variants interleaved within each, `reads` timed reads
    of the whole `mib` MiB buffer per variant and round (after one untimed read)."""
    mib = max(2, mib // 2 * 2)
    size = mib * 2**20
    lib = helper()
    kinds = [k for k in KINDS if lib is not None and lib.stream_supported(k)]
    readings = {(name, n): Reading(name, n, []) for n in threads for name in [*(KINDS[k] for k in kinds), NUMPY]}
    pointer = lib.stream_alloc(size) if lib is not None else None
    owned = None
    if pointer:
        view = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_uint64)), (size // 8,))
    else:
        owned = view = np.ones(size // 8, dtype=np.uint64)
    try:
        seconds = (ctypes.c_double * (reads + 1))()
        for _ in range(rounds):
            for n in threads:
                for k in kinds:
                    if lib.stream_read(ctypes.c_void_p(pointer), size, n, k, reads + 1, seconds):
                        raise RuntimeError(f"stream_read failed at {n} threads")
                    readings[(KINDS[k], n)].rates += [size / s for s in list(seconds)[1:]]
                _numpy_read(view, n)
                readings[(NUMPY, n)].rates += [size / _numpy_read(view, n) for _ in range(reads)]
    finally:
        del view, owned
        if pointer:
            lib.stream_free(ctypes.c_void_p(pointer))
    return list(readings.values())


def l3_bytes() -> int:
    """The last-level cache's size as Linux reports it for CPU 0 (0 where it does not)."""
    folder = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = []
    for index in folder.glob("index*"):
        try:
            level, text = (index / "level").read_text().strip(), (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20}.get(text[-1:], 1)
        sizes.append((int(level), int(text.rstrip("KM")) * scale))
    return max(sizes)[1] if sizes else 0


def best(readings: list[Reading], threads: int = 2) -> Reading:
    """The fastest variant at `threads` threads: the probe's figure."""
    return max((r for r in readings if r.threads == threads), key=lambda r: r.best)


def measure(threads: int = 2, mib: int = 1024, rounds: int = 3) -> float:
    """The probe's figure, bytes per second: the best variant's best read with `threads` threads at once."""
    return best(probe((threads,), mib, rounds), threads).best


def bf16_gemv_rate(repeats: int = 20) -> tuple[float, str]:
    """ortinf's bf16 one-row GEMV (BMatMul, the 1.5B up/gate and down projections, eight weights each read in turn):
    the faster shape's weight bytes per second, and that shape; (0, why) without the kernel library."""
    import qmatmul

    from ortinf.kernels import library

    if library.load() is None:
        return 0.0, "the kernel library is not built"
    bf16 = next(p for p in qmatmul.PRECISIONS if p.name == "bf16")
    rng = np.random.default_rng(0)
    rates = []
    for k, n in qmatmul.SHAPES["1.5b"][:2]:
        weights = [rng.standard_normal((k, n), dtype=np.float32) * 0.02 for _ in range(qmatmul.WEIGHTS)]
        graph = qmatmul.session(weights, bf16.ours, k, n)
        ms = qmatmul.best_ms(graph, rng.standard_normal((1, k)).astype(np.float32), repeats, len(weights))
        rates.append((bf16.weight_bytes(k, n) / (ms * 1e-3), f"{k} x {n}"))
        del graph, weights
    return max(rates)


def main() -> None:
    import argparse

    from record import finish

    from ortinf.matrix import machine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="16 MiB buffer, one round, no cross-check (smoke test)")
    parser.add_argument("--mib", type=int, default=1024, help="buffer size in MiB (default 1024: 32x this L3)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, variants interleaved in each (3 reads per variant per round)")
    parser.add_argument("--no-check", action="store_true", help="skip the cross-check against ortinf's bf16 one-row GEMV")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    mib, rounds = (16, 1) if args.tiny else (args.mib, args.rounds)
    readings = probe((1, 2), mib, rounds)
    top = best(readings)
    lines = [f"### Streaming read bandwidth ({time.strftime('%Y-%m-%d')})", "", f"Machine: {machine()}", "",
             f"{mib} MiB buffer, {rounds} round(s) with the variants interleaved, 3 reads per variant per round; best read "
             "(median in brackets), GB/s.", "",
             "| variant | 1 thread | 2 threads |", "|---|---:|---:|"]
    for variant in dict.fromkeys(r.variant for r in readings):
        cells = [next(r for r in readings if r.variant == variant and r.threads == n) for n in (1, 2)]
        lines.append(f"| {variant} | " + " | ".join(f"{r.best / 1e9:.1f} ({np.median(r.rates) / 1e9:.1f})" for r in cells) + " |")
    lines += ["", f"The probe's figure (best variant, 2 threads): {top.best / 1e9:.1f} GB/s ({top.variant})."]
    if args.tiny or args.no_check:
        lines.append("Cross-check against ortinf's bf16 one-row GEMV: not run (--tiny / --no-check).")
    else:
        rate, shape = bf16_gemv_rate()
        if rate:
            verdict = ("at most the probe's figure, as it must be" if rate <= top.best
                       else "ABOVE the probe's figure: the probe understates the roofline")
            lines.append(f"Cross-check: ortinf's bf16 one-row GEMV (BMatMul, {shape}, 8 weights in turn, 2 threads) read "
                         f"{rate / 1e9:.1f} GB/s = {rate / top.best:.0%} of the probe's figure: {verdict}.")
        else:
            lines.append(f"Cross-check against ortinf's bf16 one-row GEMV: not run ({shape}).")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
