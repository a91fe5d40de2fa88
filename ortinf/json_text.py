"""JSON text from outside (request fields, tool-call arguments, the model's own output) read strictly.

`json.loads` raises RecursionError, not ValueError, on nesting deeper than the interpreter's recursion
limit (~1,000 levels), and accepts NaN / Infinity, which are not JSON. Every parse of untrusted JSON
text goes through `loads` here, so that both are a ValueError the caller already handles (a 400 for a
request, "not a tool call" for model output), never a 500.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

MAX_DEPTH_MESSAGE = "nested too deeply"


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def finite_float(text: str) -> float:
    """A JSON number beyond a double's range (1e999, valid JSON that a grammar lets a model write) as the largest double of
    its sign: float() would make it inf, which json.dumps writes as Infinity, which is not JSON (a client sending such a
    call's arguments back got a 400)."""
    value = float(text)
    return value if math.isfinite(value) else math.copysign(sys.float_info.max, value)


def loads(text: str | bytes) -> Any:
    """json.loads, with deep nesting and NaN/Infinity raised as ValueError, and numbers beyond a double's range clamped."""
    try:
        return json.loads(text, parse_constant=_no_constants, parse_float=finite_float)
    except RecursionError as exc:
        raise ValueError(MAX_DEPTH_MESSAGE) from exc


def dumps(value: Any, **options: Any) -> str:
    """json.dumps, with a value nested too deeply to write raised as ValueError."""
    try:
        return json.dumps(value, **options)
    except RecursionError as exc:
        raise ValueError(MAX_DEPTH_MESSAGE) from exc


def closings(text: str, tries: int = 32) -> list[str]:
    """`text` cut inside JSON (a tool call that max_tokens ended), completed: candidates from the longest, each a prefix
    of `text` up to a point where a value may end, plus the quote and brackets that close what is open there. Text
    outside brackets is copied as is (a tool-call format's markers around its JSON); the caller keeps the first
    candidate its reader accepts. Empty when nothing is open."""
    stack: list[str] = []
    in_string = escaped = False
    cuts: list[tuple[int, str]] = []  # (end of a prefix where a value may end, the closers open there)
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if not stack:
            if char in "{[":
                stack.append("}" if char == "{" else "]")
                cuts.append((index + 1, "".join(reversed(stack))))
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
            cuts.append((index + 1, "".join(reversed(stack))))
        elif char in "}]":
            stack.pop()
        elif char == ",":
            cuts.append((index, "".join(reversed(stack))))
    if not stack:
        return []
    end = "".join(reversed(stack))
    whole = text[:-1] if escaped else text  # a lone backslash would escape the closing quote
    return [whole + ('"' if in_string else "") + end] + [text[:at] + closers for at, closers in reversed(cuts[-tries:])]
