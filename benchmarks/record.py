"""Printing a benchmark's table and, with --record, appending it to benchmarks/RESULTS.md."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def finish(lines: list[str], record: bool) -> None:
    """Prints the table (its lines) and appends it to RESULTS.md when `record`."""
    text = "\n".join([*lines, ""])
    print(text)
    if record:
        with RESULTS.open("a", encoding="utf-8") as f:
            f.write("\n" + text)
