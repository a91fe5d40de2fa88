"""Provider fixtures; the tests reuse the engine and server helpers of tests/support."""

from __future__ import annotations

import os

import pytest

from ortinf.errors import ProviderUnavailableError
from ortinf.providers.registry import Found, resolve


@pytest.fixture(scope="session")
def webgpu() -> Found:
    """The WebGPU provider (scripts/setup_webgpu.sh installs it); CI must have it."""
    try:
        return resolve("webgpu")
    except ProviderUnavailableError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc} (.ci/run runs scripts/install.sh, which runs scripts/setup_webgpu.sh)")
        pytest.skip(str(exc))
