"""Rendering a package's chat template (Jinja, sandboxed, with transformers' conventions)."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ortinf.errors import RequestError


class TemplateError(RequestError):
    """The template refused the conversation (its raise_exception) or failed to render."""


def _raise_exception(message: str) -> None:
    raise TemplateError(f"the chat template refused the conversation: {message}", param="messages")


class ChatTemplate:
    """A compiled chat template plus the special tokens it may refer to."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        self.source = source
        self.template = env.from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def load(cls, package_dir: Path) -> ChatTemplate | None:
        path = package_dir / "chat_template.jinja"
        if not path.is_file():
            return None
        config_path = package_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        return cls(path.read_text(encoding="utf-8"), _token(config, "bos_token"), _token(config, "eos_token"))

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None,
               extra: dict | None = None, continue_final_message: bool = False) -> str:
        """The conversation as text. `extra` (chat_template_kwargs) adds variables such as
        enable_thinking; it cannot replace the ones set here. With continue_final_message the text
        ends inside the last message, so the model continues it."""
        context = {**(extra or {}), "messages": messages, "add_generation_prompt": add_generation_prompt, "tools": tools,
                   "bos_token": self.bos_token, "eos_token": self.eos_token}
        try:
            text = self.template.render(**context)
        except TemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            # a template meets the conversation's data: odd content fails inside it, not in the server
            raise TemplateError(f"the chat template failed to render: {type(exc).__name__}: {exc}", param="messages") from exc
        if continue_final_message:
            final = (messages[-1].get("content") or "").strip()
            end = text.rfind(final) if final else -1
            if end < 0:
                raise TemplateError("continue_final_message: the rendered template does not contain the final message's text",
                                    param="continue_final_message")
            text = text[: end + len(final)]
        return text


def _token(config: dict, key: str) -> str:
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""
