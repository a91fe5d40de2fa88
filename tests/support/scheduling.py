"""How the default suite's tests are shared between pytest-xdist's workers (tests/conftest.py makes the scheduler).

A worker takes a test file whole, so that the file's module fixtures (a server, an export) are made once; files whose
tests share nothing costly (each starts its own subprocess) are spread test by test."""

from __future__ import annotations

from pathlib import PurePosixPath

SPREAD = {"test_benchmarks.py", "test_streaming.py"}
SPREAD_TESTS = {"test_every_build_the_machine_runs"}  # a file's tests rerun in a subprocess under a narrower kernel build


def xdist_scope(nodeid: str) -> str:
    """The unit a worker takes whole: the test's file, or the test alone (SPREAD, SPREAD_TESTS)."""
    file = nodeid.split("::", 1)[0]
    if PurePosixPath(file).name in SPREAD or nodeid.split("::")[-1].split("[")[0] in SPREAD_TESTS:
        return nodeid
    return file
