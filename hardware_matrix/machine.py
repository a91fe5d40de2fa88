"""One line describing the machine a table was measured on (never compare across machines)."""

from __future__ import annotations

from pathlib import Path

from ortinf.matrix import machine as describe  # noqa: F401 - the one description, `ortinf matrix`'s


def report(lines: list[str], record: bool) -> None:
    """Prints a table and, with --record, appends it as a section of hardware_matrix/RESULTS.md."""
    text = "\n".join(lines) + "\n"
    print(text)
    if record:
        with (Path(__file__).with_name("RESULTS.md")).open("a", encoding="utf-8") as f:
            f.write("\n" + text)
