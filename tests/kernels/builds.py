"""Rerunning a kernel test file under a narrower build of the library (ORTINF_KERNEL_ISA caps the
build each op picks), so that an AVX-512 machine checks what an AVX2-only machine, or one without
AVX2, computes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def rerun_under(isa: str, test_file: str, probe: str) -> None:
    """Runs `test_file` (but its rerun tests) with the library capped at `isa`, after checking that
    `probe` (a Python expression printing the build an op picked) shows that build."""
    if os.environ.get("ORTINF_KERNEL_ISA"):
        pytest.skip("already running under a capped build")
    env = {**os.environ, "ORTINF_KERNEL_ISA": isa}
    picked = subprocess.run([sys.executable, "-c", f"from ortinf.kernels import library; print({probe})"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert picked.stdout.strip() == isa, picked.stderr
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", test_file, "-k", "not every_build"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
