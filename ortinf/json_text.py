"""JSON text from outside (request fields, tool-call arguments, the model's own output) read strictly.

`json.loads` raises RecursionError, not ValueError, on nesting deeper than the interpreter's recursion
limit (~1,000 levels), and accepts NaN / Infinity, which are not JSON. Every parse of untrusted JSON
text goes through `loads` here, so that both are a ValueError the caller already handles (a 400 for a
request, "not a tool call" for model output), never a 500.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH_MESSAGE = "nested too deeply"


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(text: str | bytes) -> Any:
    """json.loads, with deep nesting and NaN/Infinity raised as ValueError."""
    try:
        return json.loads(text, parse_constant=_no_constants)
    except RecursionError as exc:
        raise ValueError(MAX_DEPTH_MESSAGE) from exc


def dumps(value: Any, **options: Any) -> str:
    """json.dumps, with a value nested too deeply to write raised as ValueError."""
    try:
        return json.dumps(value, **options)
    except RecursionError as exc:
        raise ValueError(MAX_DEPTH_MESSAGE) from exc
