"""The server's API front-ends, one folder each: openai/ (chat and text completions, the Responses API, embeddings,
audio, and vLLM's /tokenize, rerank/score and LoRA routes), anthropic/ (/v1/messages) and ollama/ (/api/*).

A front-end's folder holds its request models (protocol), its conversion to the chat path (what every generating
route runs: ortinf/serve/generation.py), its routes, its field-policy rows and one `FRONT_END` record in its
__init__.py: the route modules the app mounts (by name: the records import no route, so errors.py and
field_policy.py read them without an import circle), the paths that speak its dialect, the shape of its errors,
the routes whose bodies carry images inline, and its policy rows. Adding a front-end is a folder and a line in `front_ends`; ortinf/serve/ keeps
what they share (admission and streaming, generation, errors, the field-policy rules, models and state)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ortinf.serve.config import ServerConfig
    from ortinf.serve.policy_rules import Rule


@dataclass(frozen=True, slots=True)
class FrontEnd:
    name: str
    routes: Callable[[ServerConfig], list[str]]  # the modules whose `router` the app mounts under this configuration
    speaks: Callable[[str], bool]  # whether a request path is this API's (its errors are then shaped by error_body)
    error_body: Callable[[int, str, str | None, str | None], dict]  # (status, message, param, code) -> the body
    media_paths: tuple[str, ...]  # routes whose bodies carry images inline (a vision model's: the larger body limit)
    policy: dict[str, dict[str, Rule]]  # route -> field -> what it does (ortinf/serve/field_policy.py)


@functools.cache
def front_ends() -> tuple[FrontEnd, ...]:
    """Every front-end; the first, OpenAI's, is the default dialect (of /health, /metrics, /tokenize, ...)."""
    from ortinf.serve.api import anthropic, ollama, openai

    return openai.FRONT_END, anthropic.FRONT_END, ollama.FRONT_END


def speaking(path: str) -> FrontEnd:
    """The front-end whose dialect a request path speaks."""
    return next((front for front in front_ends() if front.speaks(path)), front_ends()[0])


__all__ = ["FrontEnd", "front_ends", "speaking"]
