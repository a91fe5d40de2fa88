"""Reading tool calls out of a model's text, in each model family's own format, and telling from a
chat template which format a model speaks (as OpenVINO Model Server and vLLM's `auto` do).

| parser | families | what the model writes |
|---|---|---|
| hermes | Hermes, Qwen 2/2.5/3, many fine-tunes | `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks |
| llama3_json | Llama 3.1 / 3.2 / 3.3 | `<|python_tag|>`? then `{"name": ..., "parameters": {...}}`, several joined by `;` |
| mistral | Mistral, Mixtral, Ministral | `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` or `[TOOL_CALLS]name[ARGS]{...}` |
| granite | IBM Granite 3 | `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]` |

A call that is not valid JSON leaves the whole text as content (the client sees what the model
wrote, never a half-read call). The markers of llama3_json and mistral are special tokens, which the
detokenizer skips by default: a request read by those parsers keeps special tokens in its text
(`keeps_special_tokens`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ortinf import json_text

Calls = list[tuple[str, str]]  # (name, arguments as JSON text)


@dataclass(frozen=True, slots=True)
class Parser:
    name: str
    opener: str  # what starts the calls
    template_markers: tuple[str, ...]  # any of these in a chat template means the model speaks this format
    keeps_special_tokens: bool = False

    def content_end(self, text: str) -> int:
        """How much of a partial output is surely content: the text before the opener, or before what may
        be the start of one."""
        found = text.find(self.opener)
        if found >= 0:
            return found
        for keep in range(min(len(self.opener) - 1, len(text)), 0, -1):
            if self.opener.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)

    def parse(self, text: str) -> tuple[str | None, Calls]:
        start = text.find(self.opener)
        if start < 0:
            return text, []
        try:
            calls = _READERS[self.name](text[start + len(self.opener):])
        except (ValueError, KeyError, TypeError, AttributeError):
            return text, []
        return (text[:start] or None), calls


class Llama3Json(Parser):
    """Llama 3's JSON calls may begin the reply with no marker at all: `{"name": ...`."""

    def content_end(self, text: str) -> int:
        if text.lstrip().startswith("{"):
            return 0
        return Parser.content_end(self, text)

    def parse(self, text: str) -> tuple[str | None, Calls]:
        stripped = text.lstrip()
        if stripped.startswith("{") and self.opener not in text:
            try:
                return None, _llama3(stripped)
            except (ValueError, KeyError, TypeError, AttributeError):
                return text, []
        return Parser.parse(self, text)


def _call(obj: dict, *argument_keys: str) -> tuple[str, str]:
    name = obj["name"]
    if not isinstance(name, str):
        raise TypeError("a call's name must be a string")
    arguments = next((obj[k] for k in argument_keys if k in obj), {})
    if isinstance(arguments, str):
        json_text.loads(arguments)  # arguments given as a string must hold JSON too
        return name, arguments
    if not isinstance(arguments, dict):
        raise TypeError("a call's arguments must be an object")
    return name, json_text.dumps(arguments, ensure_ascii=False)


def _hermes(rest: str) -> Calls:
    """The blocks after the first `<tool_call>`: `{json}</tool_call>` each, joined by `<tool_call>`."""
    calls = []
    for block in rest.split("<tool_call>"):
        body = block.split("</tool_call>")[0].strip()
        if body:
            calls.append(_call(json_text.loads(body), "arguments", "parameters"))
    if not calls:
        raise ValueError("no call")
    return calls


def _llama3(rest: str) -> Calls:
    calls = []
    remaining = rest.strip()
    while remaining:
        obj, end = _first_json(remaining)
        calls.append(_call(obj, "parameters", "arguments"))
        remaining = remaining[end:].strip().removeprefix(";").strip()
    if not calls:
        raise ValueError("no call")
    return calls


def _mistral(rest: str) -> Calls:
    rest = rest.strip()
    if rest.startswith("["):
        items = json_text.loads(rest)
        if not isinstance(items, list) or not items:
            raise ValueError("no call")
        return [_call(item, "arguments", "parameters") for item in items]
    calls = []  # the newer form: name[ARGS]{json}, repeated after [TOOL_CALLS]
    for part in rest.split("[TOOL_CALLS]"):
        name, arguments = part.split("[ARGS]", 1)
        calls.append(_call({"name": name.strip(), "arguments": json_text.loads(arguments.strip())}, "arguments"))
    return calls


def _granite(rest: str) -> Calls:
    items = json_text.loads(rest.strip())
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or not items:
        raise ValueError("no call")
    return [_call(item, "arguments", "parameters") for item in items]


def _first_json(text: str) -> tuple[dict, int]:
    """The JSON object at the start of `text` and where it ends."""
    try:
        obj, end = json.JSONDecoder(parse_float=json_text.finite_float).raw_decode(text)
    except RecursionError:
        raise ValueError(json_text.MAX_DEPTH_MESSAGE) from None
    if not isinstance(obj, dict):
        raise TypeError("a call must be an object")
    json_text.loads(text[:end])  # the house checks (depth, size) on what was read
    return obj, end


_READERS = {"hermes": _hermes, "llama3_json": _llama3, "mistral": _mistral, "granite": _granite}

PARSERS: dict[str, Parser] = {
    "hermes": Parser("hermes", "<tool_call>", ("<tool_call>",)),
    "llama3_json": Llama3Json("llama3_json", "<|python_tag|>", ("<|python_tag|>", "Given the following functions, please respond with a JSON"),
                              keeps_special_tokens=True),
    "mistral": Parser("mistral", "[TOOL_CALLS]", ("[TOOL_CALLS]",), keeps_special_tokens=True),
    "granite": Parser("granite", "<|tool_call|>", ("<|tool_call|>",)),
}


def detect(template_source: str | None) -> str | None:
    """The parser whose markers the chat template writes, or None."""
    if not template_source:
        return None
    return next((name for name, parser in PARSERS.items() if any(m in template_source for m in parser.template_markers)), None)
