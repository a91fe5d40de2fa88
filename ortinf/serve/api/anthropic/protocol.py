"""Anthropic's Messages request, as this server reads it (https://docs.anthropic.com/en/api/messages)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from ortinf.serve.protocol import MAX_STOP, OPEN, Finite


class MessagesRequest(BaseModel):
    """Anthropic's Messages request (https://docs.anthropic.com/en/api/messages): the fields this server reads;
    every other field goes to the field policy (ortinf/serve/field_policy.py)."""

    model_config = OPEN

    model: str | None = None
    messages: Annotated[list[dict], Field(min_length=1)]
    max_tokens: Annotated[int, Field(strict=True, ge=1)]
    system: str | list[dict] | None = None
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stream: bool = False
    temperature: Annotated[Finite, Field(ge=0.0, le=1.0)] | None = None  # Anthropic's range
    top_p: Finite | None = None
    top_k: Annotated[int, Field(strict=True)] | None = None
    tools: Annotated[list[dict], Field(max_length=128)] | None = None
    tool_choice: dict | None = None
    thinking: dict | None = None
    output_config: dict | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=256)] | None = None  # vLLM's; or the x-cache-salt header


class CountTokensRequest(MessagesRequest):
    max_tokens: Annotated[int, Field(strict=True, ge=1)] = 1  # not sent to count tokens


__all__ = ["CountTokensRequest", "MessagesRequest"]
