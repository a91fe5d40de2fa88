"""Server fixtures: real `ortinf serve` processes over tiny exported packages, one of each per pytest-xdist worker
(their tests measure what they change: counters as differences, their own requests' outputs)."""

from __future__ import annotations

import pytest
from support.server_helpers import running_server


@pytest.fixture(scope="session")
def llama_server(chat_package, tmp_path_factory):
    with running_server([str(chat_package), "--kv-cache-memory", "64MiB"], tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="session")
def embed_server(minilm_package, tmp_path_factory):
    with running_server([str(minilm_package), "--served-model-name", "minilm"], tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="session")
def byte_server(byte_package, tmp_path_factory):
    """The byte-level tiny llama (it can spell JSON) with a Hermes-style tools template."""
    with running_server([str(byte_package), "--kv-cache-memory", "64MiB"], tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="session")
def byte_client(byte_server):
    """The official openai client on byte_server."""
    import openai

    return openai.OpenAI(base_url=f"{byte_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def byte_model(byte_client) -> str:
    return byte_client.models.list().data[0].id
