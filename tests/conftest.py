"""Shared fixtures. Exports are cached per session: tracing is the slow part of most tests."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import transformers
from support.tiny_models import add_byte_tokenizer, add_tokenizer, build_decoder

import ortinf

# WebGPU lists a device on Mesa's software Vulkan driver (lavapipe) only with this; it must be set
# before the plugin is first registered. 'auto' never picks a software adapter, so CPU tests are unaffected.
os.environ.setdefault("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", "1")


@pytest.fixture(scope="session")
def decoder_package(tmp_path_factory: pytest.TempPathFactory):
    """Returns a function model_type -> (hf model, package folder), exporting each type once."""
    made: dict[str, tuple[transformers.PreTrainedModel, Path]] = {}

    def get(model_type: str) -> tuple[transformers.PreTrainedModel, Path]:
        if model_type not in made:
            root = tmp_path_factory.mktemp(model_type)
            model = build_decoder(model_type, root / "hf")
            add_tokenizer(root / "hf")
            ortinf.export(root / "hf", root / "pkg", progress=False)
            made[model_type] = (model, root / "pkg")
        return made[model_type]

    return get


@pytest.fixture(scope="session")
def byte_package(tmp_path_factory) -> Path:
    """A tiny random llama whose byte-level tokenizer can spell any text (JSON for structured output),
    with a chat template that renders tools and tool calls the Hermes way."""
    root = tmp_path_factory.mktemp("bytes")
    build_decoder("llama", root / "hf", vocab_size=384, max_position_embeddings=1024)
    add_byte_tokenizer(root / "hf", 384)
    config = json.loads((root / "hf" / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOLS_CHAT_TEMPLATE
    (root / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    ortinf.export(root / "hf", root / "tiny-bytes", progress=False)
    return root / "tiny-bytes"


# Qwen2.5's way of offering tools and showing calls and results, in miniature.
TOOLS_CHAT_TEMPLATE = (
    "{% if greeting is defined %}{{ greeting }}\n{% endif %}"
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>\n"
    "{% elif m.tool_calls %}{{ m.role }}: {% for c in m.tool_calls %}<tool_call>\n"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}\n"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


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
