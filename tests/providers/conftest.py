"""Provider tests reuse the engine and server helpers of tests/runtime and tests/e2e."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ortinf.errors import ProviderUnavailableError
from ortinf.providers.registry import Found, resolve

HERE = Path(__file__).resolve().parent
for folder in (HERE.parent / "runtime", HERE.parent / "e2e"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


@pytest.fixture(scope="session")
def webgpu() -> Found:
    """The WebGPU provider (scripts/setup_webgpu.sh installs it); CI must have it."""
    try:
        return resolve("webgpu")
    except ProviderUnavailableError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc} (.ci/run runs scripts/install.sh, which runs scripts/setup_webgpu.sh)")
        pytest.skip(str(exc))
