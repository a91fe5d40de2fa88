"""Ollama's request bodies (https://github.com/ollama/ollama/blob/main/docs/api.md) and what they mean as OpenAI chat
completions: `options` as sampling fields, `keep_alive` as seconds, messages with base64 images and id-less tool calls
as OpenAI's messages. The routes are ortinf/serve/api/ollama/routes.py."""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ortinf.serve.errors import APIError
from ortinf.serve.generation import as_chat_request
from ortinf.serve.protocol import MAX_EMBEDDING_INPUTS, MAX_STOP, OPEN, ChatCompletionRequest, Finite

MAX_TOP_LOGPROBS = 20  # Ollama's bound


class Options(BaseModel):
    """Ollama's `options`: the sampling ones are read; the rest (runner settings: num_ctx, num_gpu, num_thread, ...)
    are named as ignored, as an unknown field is."""

    model_config = ConfigDict(extra="allow")

    temperature: Finite | None = None
    top_p: Finite | None = None
    top_k: Annotated[int, Field(strict=True)] | None = None
    min_p: Finite | None = None
    seed: Annotated[int, Field(strict=True)] | None = None
    num_predict: Annotated[int, Field(strict=True)] | None = None
    stop: Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    repeat_penalty: Finite | None = None
    presence_penalty: Finite | None = None
    frequency_penalty: Finite | None = None
    cache_salt: str | None = None  # vLLM's, where a client sends only options (the ollama client); checked as the top level's

    def sampling(self) -> dict:
        """ChatCompletionRequest's fields for these options, num_predict aside (`max_tokens`)."""
        fields = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p, "seed": self.seed,
                  "stop": self.stop, "repetition_penalty": self.repeat_penalty, "presence_penalty": self.presence_penalty,
                  "frequency_penalty": self.frequency_penalty}
        return {key: value for key, value in fields.items() if value is not None}

    def max_tokens(self) -> int | None:
        """num_predict as a limit, None for none (-1 or -2: as long as the context allows). Ollama stops at the
        context's end whatever num_predict says, so the route clips it there (routes._clipped), not a 400."""
        if self.num_predict is not None and self.num_predict > 0:
            return self.num_predict
        if self.num_predict is not None and self.num_predict not in (-1, -2):
            raise APIError(400, "options.num_predict must be positive, or -1 (no limit) or -2 (fill the context)", param="options.num_predict")
        return None


class GenerateFields(BaseModel):
    model_config = OPEN

    model: str
    stream: bool = True  # Ollama streams unless told not to
    format: str | dict | None = None
    options: Options | None = None
    think: bool | str | None = None
    keep_alive: float | str | None = None
    logprobs: bool = False  # Ollama's (0.12 on): each line's tokens with their logprobs
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_TOP_LOGPROBS)] = 0  # alternatives per token, with logprobs
    cache_salt: str | None = None  # vLLM's: prefix-cache blocks are shared only between requests with the same salt

    def salt(self) -> str | None:
        """The request's cache salt: the top level's, else options.cache_salt."""
        return self.cache_salt or (self.options.cache_salt if self.options is not None else None) or None

    def logprobs_count(self) -> int | None:
        """SamplingParams' logprobs: the alternatives per token, None without logprobs (top_logprobs alone asks for
        nothing, as in Ollama)."""
        return self.top_logprobs if self.logprobs else None


class ChatRequest(GenerateFields):
    messages: list[dict] = Field(default_factory=list)
    tools: Annotated[list[dict], Field(max_length=128)] | None = None


class GenerateRequest(GenerateFields):
    prompt: str | None = None
    system: str | None = None
    images: list[str] | None = None
    raw: bool = False


class EmbedRequest(BaseModel):
    model_config = OPEN

    model: str
    input: str | Annotated[list[str], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    truncate: bool = True
    dimensions: Annotated[int, Field(strict=True, ge=1)] | None = None
    keep_alive: float | str | None = None


class EmbeddingsRequest(BaseModel):
    model_config = OPEN

    model: str
    prompt: str
    keep_alive: float | str | None = None


class ModelRequest(BaseModel):
    model_config = OPEN

    model: str | None = None
    name: str | None = None  # the older spelling of model


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# Ollama holds keep_alive as a Go time.Duration, whose longest is 2^63 ns (~292 years); a longer one means what its
# negative does, forever, here (its expires_at in /api/ps is routes.FOREVER), and never reaches a clock or a date
LONGEST_KEEP_ALIVE = 2**63 * 1e-9


def keep_alive_seconds(value: float | str) -> float:
    """Ollama's keep_alive in seconds: a number of seconds or a Go duration (5m, 1h30m, "0", "-1"); negative, or longer
    than LONGEST_KEEP_ALIVE: forever (inf). NaN and infinity, or any other text, are a 400."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise APIError(400, "keep_alive must be seconds or a duration such as 5m", param="keep_alive")
    text = str(value).strip()
    negative = text.startswith("-")
    try:
        seconds = float(value) if not isinstance(value, str) else float(text)
    except ValueError:
        pieces = _DURATION.findall(text.removeprefix("-"))
        if not pieces or "".join(number + unit for number, unit in pieces) != text.removeprefix("-"):
            raise APIError(400, f"keep_alive must be seconds or a duration such as 5m or 1h30m (negative: stay loaded), not "
                                f"{text[:40]!r}", param="keep_alive") from None
        seconds = sum(float(number) * _UNIT[unit] for number, unit in pieces)
    else:
        if not math.isfinite(seconds):
            raise APIError(400, f"keep_alive must be a finite number of seconds (negative: stay loaded), not {text[:40]}", param="keep_alive")
    if negative or seconds < 0 or seconds > LONGEST_KEEP_ALIVE:
        return float("inf")
    return seconds


def images_as_parts(images: list, where: str) -> list[dict]:
    """Ollama's base64 images as chat image parts (the decoder reads the format from the bytes)."""
    if not isinstance(images, list) or not all(isinstance(image, str) for image in images):
        raise APIError(400, f"{where}.images must be a list of base64 strings", param=f"{where}.images")
    return [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}} for image in images]


def chat_messages(messages: list[dict]) -> list[dict]:
    """Ollama's messages as OpenAI's: images as image parts, tool calls with ids (Ollama's have none: a tool message
    answers the earliest unanswered call of its tool_name, else the earliest unanswered one)."""
    converted, pending = [], []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
            raise APIError(400, f"{where}.role must be system, user, assistant or tool", param=f"{where}.role")
        content = message.get("content") or ""
        if not isinstance(content, str):
            raise APIError(400, f"{where}.content must be a string", param=f"{where}.content")
        body: dict[str, Any] = {"role": message["role"], "content": content}
        if message.get("images"):
            body["content"] = [{"type": "text", "text": content}, *images_as_parts(message["images"], where)]
        if message["role"] == "assistant" and message.get("tool_calls"):
            calls = []
            for position, call in enumerate(message["tool_calls"]):
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise APIError(400, f"{where}.tool_calls.{position} needs function.name", param=f"{where}.tool_calls")
                arguments = function.get("arguments") or {}
                call_id = f"call_{index}_{position}"
                pending.append((call_id, function["name"]))
                calls.append({"id": call_id, "type": "function", "function": {
                    "name": function["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
            body["tool_calls"] = calls
            body["content"] = content or None
        if message["role"] == "tool":
            name = message.get("tool_name") or message.get("name")
            match = next((p for p in pending if p[1] == name), pending[0] if pending else None)
            if match is not None:
                pending.remove(match)
                body["tool_call_id"] = match[0]
            if isinstance(name, str):
                body["name"] = name
        converted.append(body)
    return converted


def chat_request(body: GenerateFields, messages: list[dict], tools: list[dict] | None = None) -> ChatCompletionRequest:
    fields: dict = {"model": body.model, "messages": messages, "stream": body.stream, "cache_salt": body.salt(),
                    **(body.options.sampling() if body.options else {})}
    if tools:
        fields["tools"] = tools
    if body.format == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(body.format, dict):
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": body.format}}
    elif body.format not in (None, ""):
        raise APIError(400, "format must be \"json\" or a JSON schema object", param="format")
    if body.think is not None:  # Qwen3's templates read enable_thinking, gpt-oss's reasoning_effort
        template: dict = {"enable_thinking": body.think is not False}
        if isinstance(body.think, str):
            template["reasoning_effort"] = body.think
        fields["chat_template_kwargs"] = template
    return as_chat_request(fields)
