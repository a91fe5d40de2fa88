"""The server in process for the protocol tests (support/app_helpers.py): the byte-level tiny llama, whose
byte-level tokenizer can spell JSON and whose template renders tools, on the real app and engine."""

from __future__ import annotations

import pytest
from support.app_helpers import serving

from ortinf.serve.state import ServerConfig


@pytest.fixture(scope="session")
def byte_app(byte_package):
    with serving(ServerConfig(packages=(byte_package,), engine_options={"kv_cache_memory": "64MiB"})) as server:
        yield server


@pytest.fixture(scope="session")
def client(byte_app):
    """The official openai client on byte_app (a module that serves otherwise has a `client` of its own)."""
    return byte_app.openai()


@pytest.fixture(scope="session")
def model(client) -> str:
    return client.models.list().data[0].id
