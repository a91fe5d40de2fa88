"""What a test run spent on its two expensive kinds of setup, printed at the end of the run: exports (made in
this process through ortinf.export, or taken from the package cache) and real `ortinf serve` processes started.

Under pytest-xdist each worker keeps its own tally and hands it to the controller with its other output
(tests/conftest.py), which adds them up."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class RunReport:
    counts: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)
    by_file: Counter = field(default_factory=Counter)  # "kind file" -> seconds
    current_file: str = ""  # the test file running now (tests/conftest.py sets it)

    @contextlib.contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.record(kind, time.monotonic() - start)

    def record(self, kind: str, seconds: float) -> None:
        self.counts[kind] += 1
        self.seconds[kind] += seconds
        self.by_file[f"{kind} {self.current_file}"] += seconds

    def add(self, other: dict) -> None:
        for name in ("counts", "seconds", "by_file"):
            getattr(self, name).update(other.get(name, {}))

    def as_dict(self) -> dict:
        return {"counts": dict(self.counts), "seconds": dict(self.seconds), "by_file": dict(self.by_file)}

    def top(self, kind: str, n: int = 5) -> str:
        found = [(seconds, key.split(" ", 1)[1]) for key, seconds in self.by_file.items() if key.startswith(kind + " ")]
        return ", ".join(f"{name} {seconds:.0f} s" for seconds, name in sorted(found, reverse=True)[:n])

    def lines(self) -> list[str]:
        def part(kind: str, label: str) -> str:
            return f"{self.counts[kind]} {label} ({self.seconds[kind]:.0f} s)"

        return [
            f"exports: {part('export', 'made')}; {part('factory_export', 'folders made by the package factory')}; "
            f"{self.counts['factory_hit']} taken from its store (made by the other worker or an earlier run)",
            f"  most in: {self.top('export')}",
            f"servers: {part('server', 'started')} (seconds from start to healthy)",
            f"  most in: {self.top('server')}",
        ]


# One tally per process: the exporter wrapper and running_server add to it, the terminal summary reads it.
REPORT = RunReport()
