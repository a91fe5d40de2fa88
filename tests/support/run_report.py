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

    @contextlib.contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.counts[kind] += 1
            self.seconds[kind] += time.monotonic() - start

    def add(self, other: dict) -> None:
        self.counts.update(other.get("counts", {}))
        self.seconds.update(other.get("seconds", {}))

    def as_dict(self) -> dict:
        return {"counts": dict(self.counts), "seconds": dict(self.seconds)}

    def lines(self) -> list[str]:
        def part(kind: str, label: str) -> str:
            return f"{self.counts[kind]} {label} ({self.seconds[kind]:.0f} s)"

        return [
            f"exports: {part('export', 'made')}; {part('factory_export', 'folders made by the package factory')}; "
            f"{self.counts['factory_hit']} packages reused from the cache of earlier runs",
            f"servers: {part('server', 'started')} (seconds from start to healthy)",
        ]


# One tally per process: the exporter wrapper and running_server add to it, the terminal summary reads it.
REPORT = RunReport()
