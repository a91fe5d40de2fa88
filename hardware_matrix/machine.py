"""One line describing the machine a table was measured on (never compare across machines)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def describe() -> str:
    """'x86_64, 2 cores, CPU flags avx avx2' (the AVX/AMX flags decide ORT's CPU kernels)."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = sorted({f for f in cpuinfo.read_text().split() if f.startswith(("avx", "amx"))}) if cpuinfo.exists() else []
    return f"{platform.machine()}, {os.cpu_count()} cores, CPU flags {' '.join(flags) or '-'}"


def report(lines: list[str], record: bool) -> None:
    """Prints a table and, with --record, appends it as a section of hardware_matrix/RESULTS.md."""
    text = "\n".join(lines) + "\n"
    print(text)
    if record:
        with (Path(__file__).with_name("RESULTS.md")).open("a", encoding="utf-8") as f:
            f.write("\n" + text)
