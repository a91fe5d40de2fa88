"""The instruction peaks of this CPU, measured: fp32 FMA (256- and 512-bit), vdpbf16ps (AVX512_BF16) and vpdpbusd
(AVX512_VNNI), each as 12 independent register chains per thread (benchmarks/peak.c: no memory, so the rate is the
cores' issue limit for the instruction), on 1 and 2 threads, best of several rounds. A GEMM's share of its
instruction's peak (benchmarks/qmatmul.py at 512 rows) is stated against these figures, measured in the same run.

usage: .venv/bin/python benchmarks/peak.py [--rounds N] [--record] [--tiny]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from compiled import load_c
from record import finish

from ortinf.matrix import machine

SOURCE = Path(__file__).with_name("peak.c")
KINDS = {"fp32 FMA, 256-bit": 0, "fp32 FMA, 512-bit": 1, "vdpbf16ps": 2, "vpdpbusd": 3}
UNITS = {0: "GFLOP/s", 1: "GFLOP/s", 2: "GFLOP/s", 3: "GOP/s"}


def _library() -> ctypes.CDLL | None:
    lib = load_c(SOURCE)
    if lib is not None:
        lib.peak_rate.restype = ctypes.c_double
        lib.peak_rate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.peak_supported.argtypes = [ctypes.c_int]
        lib.peak_ops_per_instruction.restype = ctypes.c_double
        lib.peak_ops_per_instruction.argtypes = [ctypes.c_int]
    return lib


def measure(threads: int = 2, rounds: int = 3, seconds: float = 0.2) -> dict[str, float]:
    """Operations per second (best of `rounds`) per instruction this CPU runs; empty without a C compiler."""
    lib = _library()
    if lib is None:
        return {}
    found = {}
    for name, kind in KINDS.items():
        if not lib.peak_supported(kind):
            continue
        n = 100_000  # rounds of the 12 chains per thread, grown until one thread's run takes `seconds` / 4 to `seconds`
        while n * 12 * lib.peak_ops_per_instruction(kind) / lib.peak_rate(kind, 1, n) < seconds / 4:
            n *= 4
        found[name] = max(lib.peak_rate(kind, threads, n) for _ in range(rounds))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="runs per instruction and thread count; the best is kept")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="one round of short runs (smoke test)")
    args = parser.parse_args()
    rounds, seconds = (1, 0.02) if args.tiny else (args.rounds, 0.2)
    one, two = measure(1, rounds, seconds), measure(2, rounds, seconds)
    if not two:
        sys.exit("peak.py needs a C compiler ($CC or gcc)")
    lines = [f"### Instruction peaks, 12 register chains per thread, best of {rounds} ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {machine()}", "", "| instruction | 1 thread | 2 threads |", "|---|---:|---:|"]
    for name, rate in two.items():
        unit = UNITS[KINDS[name]]
        lines.append(f"| {name} | {one[name] / 1e9:.0f} {unit} | {rate / 1e9:.0f} {unit} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
