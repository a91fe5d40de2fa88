"""Chat: a package's conversation front-end, the one home of what turns messages into a prompt (LLM.chat,
`ortinf chat`, the server's /v1/chat/completions, /v1/responses and /tokenize all call it).

It holds the package's chat template, tokenizer, image placeholder (a vision-language model's) and the
tool-call and reasoning parsers chosen for its template; `prompt` renders validated messages into token ids,
`images` reads their images (data URLs, or fetched under the server's media policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortinf.errors import RequestError
from ortinf.tasks.chat import reasoning
from ortinf.tasks.chat.media import MediaPolicy, has_images, message_images
from ortinf.tasks.chat.messages import ChatMessage
from ortinf.tasks.chat.template import ChatTemplate, TemplateError
from ortinf.tasks.chat.tools import resolve_parser, template_messages
from ortinf.tokenizer import check_unicode

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ortinf.manifest import VisionSpec


@dataclass(slots=True)
class Chat:
    template: ChatTemplate | None
    tokenizer: Tokenizer | None
    placeholder: str | None = None  # a vision-language model's image placeholder text, where an image part goes
    tool_parser: str | None = None  # how tool calls are read from the output (ortinf/tasks/chat/tools.py)
    reasoning_parser: reasoning.ReasoningParser | reasoning.HarmonyParser | None = None  # how thinking is split from the answer (reasoning.py)

    @classmethod
    def load(cls, package_dir: str | Path, tokenizer: Tokenizer | None, vision: VisionSpec | None = None,
             tool_call_parser: str = "auto", reasoning_parser: str = "none") -> Chat:
        """The package's chat; `tool_call_parser` / `reasoning_parser`: a parser's name, "auto" (the one the
        template speaks) or "none" (the server's --tool-call-parser / --reasoning-parser)."""
        from ortinf.runtime.worker.image_prompt import placeholder_text

        template = ChatTemplate.load(package_dir)
        source = template.source if template is not None else None
        placeholder = None
        if vision is not None and tokenizer is not None:
            try:
                placeholder = placeholder_text(vision, tokenizer)
            except TypeError:  # the tokenizer cannot spell the image token: the model reads text only
                placeholder = None
        return cls(template, tokenizer, placeholder, resolve_parser(tool_call_parser, source), reasoning.resolve(reasoning_parser, source))

    @staticmethod
    def parse(messages: Sequence[dict | ChatMessage]) -> list[ChatMessage]:
        """OpenAI-style messages, validated (a RequestError names the first bad field)."""
        from pydantic import ValidationError

        try:
            return [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m) for m in messages]
        except ValidationError as exc:
            error = exc.errors()[0]
            raise RequestError(f"a message is not valid: {'.'.join(str(x) for x in error['loc'])}: {error['msg']}",
                               param="messages") from exc

    def prompt(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True, tools: list[dict] | None = None,
               extra: dict[str, Any] | None = None, continue_final_message: bool = False, add_special_tokens: bool = False) -> list[int]:
        """The conversation through the chat template, as token ids (the template writes the special tokens, BOS and
        role markers, itself: `add_special_tokens` adds the tokenizer's too, vLLM's field)."""
        if self.template is None or self.tokenizer is None:
            raise RequestError("this model has no chat template (or no tokenizer): use plain completions", param="messages")
        if continue_final_message and add_generation_prompt:
            raise RequestError("continue_final_message and add_generation_prompt cannot both be true: set add_generation_prompt "
                               "to false", param="continue_final_message")
        rendered = template_messages(list(messages), self.placeholder)

        def render(conversation: list[dict]) -> str:
            return self.template.render(conversation, add_generation_prompt=add_generation_prompt, tools=tools, extra=extra,
                                        continue_final_message=continue_final_message)

        later = [m["content"] for m in _after_leading_system(rendered) if m["role"] == "system" and m["content"]]
        if not later:
            text = render(rendered)
        else:  # a system message mid-conversation (Claude Code sends them): where it was, if the template writes it there
            try:
                text = render(rendered)
            except TemplateError:
                text = None
            if text is None or not all(content in text for content in later):
                text = render(_merged_system(rendered))  # the template refused or dropped it: into the leading system prompt
        return self.tokenizer.encode(check_unicode(text, "messages"), add_special_tokens=add_special_tokens).ids

    def images(self, messages: Sequence[ChatMessage], policy: MediaPolicy | None = None) -> list[bytes]:
        """The conversation's images, in order, on a vision-language model (none on a text model, whose
        template refuses image parts)."""
        if self.placeholder is None:
            return []
        if self.has_images(messages):
            from ortinf import extras

            lacking = extras.needs("vision", "reading images")
            if lacking:  # the package is served text-only without Pillow
                raise RequestError(lacking, param="messages")
        return message_images(list(messages), policy or MediaPolicy())

    def has_images(self, messages: Sequence[ChatMessage]) -> bool:
        return self.placeholder is not None and has_images(list(messages))


def _after_leading_system(messages: list[dict]) -> list[dict]:
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    return messages[first:]


def _merged_system(messages: list[dict]) -> list[dict]:
    """The conversation with every system message after the first turn moved into the leading system prompt (joined by
    blank lines, in order): what a template that accepts a system prompt only first can still show the model."""
    leading = messages[:len(messages) - len(_after_leading_system(messages))]
    rest = _after_leading_system(messages)
    texts = [m["content"] for m in leading + [m for m in rest if m["role"] == "system"] if m["content"]]
    return [{"role": "system", "content": "\n\n".join(texts)}, *(m for m in rest if m["role"] != "system")]


__all__ = ["Chat"]
