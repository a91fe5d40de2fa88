"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, as a front-end over the chat path.

A request is read into the chat completion it means (system, turns, images, tool_use and tool_result blocks as
OpenAI's messages; tools and tool_choice as OpenAI's), so the same Chat renders it, the same tool plan constrains
or parses the calls and the same reasoning parser splits the thinking; only the framing is Anthropic's: content
blocks, stop_reason, usage, and the typed stream events (message_start, content_block_start/delta/stop,
message_delta, message_stop). Errors on these paths are Anthropic-shaped (ortinf/serve/errors.py), and the API
key may come as `x-api-key` (ortinf/serve/app.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.serve import field_policy
from ortinf.serve.errors import APIError, error_body, from_exception
from ortinf.serve.generation import Reply, as_chat_request, chat_params, count_prompt_tokens, prepare_samples, render_prompt, tool_plan
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import MAX_STOP, OPEN, ChatCompletionRequest, Finite
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import AdmittedStream, final_outputs, merged, prepare_off_loop, sequences, until_disconnected
from ortinf.tasks.chat.tools import ToolCall, ToolPlan

router = APIRouter()
ROUTE = "/v1/messages"
THINKING = ("enabled", "adaptive", "between_tools", "disabled")  # thinking.type: every kind but disabled lets the model think


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


def _text_of(blocks, where: str) -> str:
    """The text of a string or of a list of text blocks (a system prompt, a tool result)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise APIError(400, f"{where} must be a string or a list of text blocks", param=where)
    texts = []
    for index, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise APIError(400, f"{where}.{index}: a block of type '{str(kind)[:40]}' cannot go here: send text blocks "
                                "(an image goes in a user message)", param=where)
        texts.append(block["text"])
    return "\n".join(texts)


def _image(block: dict, where: str) -> dict:
    source = block.get("source")
    if not isinstance(source, dict):
        raise APIError(400, f"{where}.source: an image block needs a source", param=where)
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        media_type = source.get("media_type") or "image/png"
        return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{source['data']}"}}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise APIError(400, f"{where}.source: send a base64 source (type, media_type, data) or a url source (type, url)", param=where)


def _document(block: dict, where: str) -> str:
    """A document block's text (a text source, or a content source of text blocks), after its title and context."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text" and isinstance(source.get("data"), str):
        text = source["data"]
    elif kind == "content":
        text = _text_of(source.get("content"), f"{where}.source.content")
    else:
        raise APIError(400, f"{where}.source: a document of source type '{str(kind)[:40]}' cannot be read here (a PDF has no "
                            "text this server extracts): send its text as a text source (type text, media_type text/plain, data)",
                       param=where)
    head = [value for value in (block.get("title"), block.get("context")) if isinstance(value, str) and value]
    return "\n".join([*head, text])


def _turn(message: dict, index: int) -> list[dict]:
    """One Anthropic message as OpenAI chat messages: a user turn's tool results become tool messages (before its
    other content), an assistant turn's tool_use blocks its tool calls; thinking blocks of earlier turns are dropped
    (as Anthropic's own API drops them from the prompt of earlier turns)."""
    where = f"messages.{index}"
    role, content = message.get("role") if isinstance(message, dict) else None, message.get("content") if isinstance(message, dict) else None
    if role == "system":  # Claude Code's mid-conversation system messages: at their position where the template allows
        return [{"role": "system", "content": _text_of(content if content is not None else "", f"{where}.content")}]
    if role not in ("user", "assistant"):  # Anthropic's wording
        raise APIError(400, f"{where}.role: Input should be 'user' or 'assistant'", param=f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise APIError(400, f"{where}.content must be a string or a list of content blocks", param=f"{where}.content")
    parts, calls, results = [], [], []
    for position, block in enumerate(content):
        at = f"{where}.content.{position}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append(_image(block, at))
        elif kind == "document" and role == "user":
            parts.append({"type": "text", "text": _document(block, at)})
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise APIError(400, f"{at}: a tool_use block needs an id and a name", param=at)
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append({"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise APIError(400, f"{at}: a tool_result block needs the tool_use_id it answers", param=at)
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": _text_of(block.get("content") or "", at)})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        else:
            raise APIError(400, f"{at}: a {role} message cannot hold a block of type '{str(kind)[:40]}' here (text, image, "
                                "document and tool_result in user turns; text, tool_use and thinking in assistant turns)", param=at)
    turns = list(results)
    if parts or (role == "assistant" and calls) or not results:
        text_only = all(p["type"] == "text" for p in parts)
        body: dict = {"role": role, "content": "".join(p["text"] for p in parts) if text_only else parts}
        if calls:
            body["tool_calls"] = calls
            body["content"] = body["content"] or None
        turns.append(body)
    return turns


def _tools(body: MessagesRequest, hosted: str = "ignore", ignored: list[str] | None = None) -> tuple[list[dict] | None, object, bool]:
    """(chat tools, chat tool_choice, parallel calls allowed) of the request's tools and tool_choice. A server tool
    (web_search_..., code_execution_...: Anthropic runs them) is left out and named in `ignored` (--hosted-tools
    ignore) or refused; so is a tool with defer_loading, which Anthropic's API keeps out of the model's context until
    a tool search loads it (Claude Code declares one)."""
    converted = []
    for index, tool in enumerate(body.tools or []):
        if not isinstance(tool, dict):
            raise APIError(400, f"tools.{index}: a tool must be an object", param="tools")
        if tool.get("type") not in (None, "custom") and hosted == "ignore" and ignored is not None:
            ignored.append(f"tools.{index} ({str(tool.get('type'))[:40]})")
            continue
        if tool.get("type") not in (None, "custom") or not isinstance(tool.get("name"), str):
            raise APIError(400, f"tools.{index}: tools of type '{str(tool.get('type'))[:40]}' are not supported: this server runs no "
                                "server tools; declare a client tool (name, description, input_schema)", param="tools")
        if tool.get("defer_loading") is True and ignored is not None:
            ignored.append(f"tools.{index} (defer_loading)")
            continue
        function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        if tool.get("description"):
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    choice, parallel = body.tool_choice or {}, True
    kind = choice.get("type", "auto")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind == "auto":
        mapped = "auto" if converted else None
    elif kind == "any":
        mapped = "required"
    elif kind == "none":
        mapped = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        mapped = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise APIError(400, "tool_choice.type must be auto, any, tool (with a name) or none", param="tool_choice")
    return converted or None, mapped, parallel


def chat_request(body: MessagesRequest, hosted: str = "ignore", ignored: list[str] | None = None) -> ChatCompletionRequest:
    """The chat completion a Messages request means (`hosted`, `ignored`: as `_tools` reads server tools)."""
    messages = [{"role": "system", "content": _text_of(body.system, "system")}] if body.system else []
    for index, message in enumerate(body.messages):
        messages += _turn(message, index)
    tools, choice, parallel = _tools(body, hosted, ignored)
    fields: dict = {"model": body.model, "messages": messages, "max_tokens": body.max_tokens, "stop": body.stop_sequences,
                    "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k, "tools": tools,
                    "tool_choice": choice, "parallel_tool_calls": parallel, "stream": body.stream}
    template: dict = {}
    thinking = (body.thinking or {}).get("type")
    if thinking in THINKING:  # Qwen3's templates (and others') read enable_thinking
        template["enable_thinking"] = thinking != "disabled"
    elif thinking is not None:
        raise APIError(400, f"thinking.type must be one of {', '.join(THINKING)}", param="thinking")
    output = body.output_config or {}
    if output.get("effort") is not None:  # templates that read reasoning_effort (gpt-oss's) use it
        template["reasoning_effort"] = str(output["effort"])
    fmt = output.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}", param="output_config.format")
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    if template:
        fields["chat_template_kwargs"] = template
    return as_chat_request(fields, {"max_tokens": "max_tokens", "stop": "stop_sequences"})


def _stop_reason(completion_reason: str | None, stop_reason, called: bool, stops: list[str] | None) -> tuple[str, str | None]:
    """Anthropic's (stop_reason, stop_sequence) of a finished output."""
    if completion_reason == "length":  # a call max_tokens cut too (its input as far as it came): Anthropic's stop reason
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(stop_reason, str) and stop_reason in (stops or []):
        return "stop_sequence", stop_reason
    return "end_turn", None


def _tool_use(call: ToolCall) -> dict:
    try:
        arguments = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        arguments = {}
    if not isinstance(arguments, dict):
        arguments = {"value": arguments}
    return {"type": "tool_use", "id": f"toolu_{call.id.removeprefix('call_')}", "name": call.name, "input": arguments}


def _usage(prompt_tokens: int, output_tokens: int, cached: int) -> dict:
    """Anthropic counts the cached prompt tokens apart: input_tokens + cache_read_input_tokens is the prompt."""
    return {"input_tokens": prompt_tokens - cached, "output_tokens": output_tokens, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0}


async def _prepared(body: MessagesRequest, state: ServerState,
                    request: Request) -> tuple[ServedModel, ChatCompletionRequest, ToolPlan, list, list[str]]:
    ignored = field_policy.apply(ROUTE, body)
    model = await state.model(body.model, request)
    model.require_engine()
    chat = chat_request(body, state.config.hosted_tools, ignored)
    tools = tool_plan(model, chat, state.config.default_tool_choice)
    params = chat_params(model, chat, tools, None)
    salt = body.cache_salt or request.headers.get("x-cache-salt") or None  # a header, for clients that send only Anthropic's fields
    if salt is not None and len(salt) > 256:
        raise APIError(400, "x-cache-salt: at most 256 characters", param="cache_salt")

    def prepare() -> list:  # rendering, tokenising and decoding images are CPU work: off the event loop
        images = model.chat.images(chat.messages, state.config.media_policy) if model.chat is not None else []
        return prepare_samples(model, [render_prompt(model, chat, tools)], params, 1, body.stream, images=images,
                               cache_salt=salt)

    prepared = await prepare_off_loop(state.admission, prepare, model.chat is not None and model.chat.has_images(chat.messages), 1)
    return model, chat, tools, prepared, ignored


@router.post(ROUTE, responses={200: {"description": "a message, or with stream=true its server-sent events"}})
async def create_message(body: MessagesRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    model, chat, tools, prepared, ignored = await _prepared(body, state, request)
    message_id = f"msg_{uuid.uuid4().hex}"
    headers = field_policy.ignored_headers(ignored)
    if tools.warning:  # tools sent to a model whose tool-call format is unknown: answered as text, and said so
        headers[field_policy.WARNING_HEADER] = tools.warning
    ticket = state.admission.acquire(sequences(prepared))
    if body.stream:
        stream = AdmittedStream(_events(body, model, tools, prepared, message_id), ticket)
        stream.headers.update(headers)
        return stream
    try:
        (output,) = await until_disconnected(request, final_outputs(model.require_engine(), prepared, message_id))
    finally:
        ticket.release()
    return JSONResponse(_message(body, model, tools, prepared, message_id, output), headers=headers)


def _message(body: MessagesRequest, model: ServedModel, tools: ToolPlan, prepared: list, message_id: str, output: RequestOutput) -> dict:
    completion = output.outputs[0]
    reply = Reply(model, tools)
    reply.feed(completion.text, True, completion.finish_reason == "length")
    content: list[dict] = []
    if reply.reasoning is not None:
        content.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.content:
        content.append({"type": "text", "text": reply.content})
    content += [_tool_use(call) for call in reply.calls]
    reason, sequence = _stop_reason(completion.finish_reason, completion.stop_reason, bool(reply.calls), body.stop_sequences)
    return {"id": message_id, "type": "message", "role": "assistant", "model": model.name, "content": content,
            "stop_reason": reason, "stop_sequence": sequence,
            "usage": _usage(prepared[0].num_prompt_tokens, len(completion.token_ids), output.num_cached_tokens or 0)}


def _event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


async def _events(body: MessagesRequest, model: ServedModel, tools: ToolPlan, prepared: list, message_id: str) -> AsyncIterator[str]:
    """The Messages stream: message_start (with the first output: its usage splits the prompt into input and cache-read
    tokens as message_delta's does), then each content block opened, its deltas and closed in order (the
    thinking, the text, each tool_use with its input as input_json_delta once the call is read), message_delta with
    the stop reason and usage, message_stop; an error event if anything fails (the headers are already sent)."""
    start = {"id": message_id, "type": "message", "role": "assistant", "model": model.name, "content": [], "stop_reason": None,
             "stop_sequence": None}
    started = False
    reply = Reply(model, tools)
    index, open_kind = -1, None

    def opened(kind: str, block: dict) -> list[str]:
        nonlocal index, open_kind
        events = [_event("content_block_stop", {"index": index})] if open_kind is not None else []
        index, open_kind = index + 1, kind
        return [*events, _event("content_block_start", {"index": index, "content_block": block})]

    samples = merged(model.require_engine(), prepared, message_id)
    try:
        async for _, output in samples:
            if not started:  # sent with the first output, once the prefix cache's share of the prompt is known
                started = True
                usage = _usage(prepared[0].num_prompt_tokens, 0, output.num_cached_tokens or 0)
                yield _event("message_start", {"message": {**start, "usage": usage}})
            delta = output.outputs[0]
            finished = bool(delta.finish_reason)
            thinking, text = reply.feed(delta.text, finished, delta.finish_reason == "length")
            if thinking:
                if open_kind != "thinking":
                    for event in opened("thinking", {"type": "thinking", "thinking": "", "signature": ""}):
                        yield event
                yield _event("content_block_delta", {"index": index, "delta": {"type": "thinking_delta", "thinking": thinking}})
            if text:
                if open_kind == "thinking":
                    yield _event("content_block_delta", {"index": index, "delta": {"type": "signature_delta", "signature": ""}})
                if open_kind != "text":
                    for event in opened("text", {"type": "text", "text": ""}):
                        yield event
                yield _event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": text}})
            if not finished:
                continue
            for call in reply.calls:
                block = _tool_use(call)
                for event in opened("tool_use", {**block, "input": {}}):
                    yield event
                yield _event("content_block_delta", {"index": index, "delta": {"type": "input_json_delta",
                                                                                 "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
            if open_kind is not None:
                yield _event("content_block_stop", {"index": index})
            reason, sequence = _stop_reason(delta.finish_reason, delta.stop_reason, bool(reply.calls), body.stop_sequences)
            usage = _usage(prepared[0].num_prompt_tokens, output.num_output_tokens, output.num_cached_tokens or 0)
            yield _event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage})
            yield _event("message_stop", {})
    except Exception as exc:  # noqa: BLE001 - reported in the stream, whose headers are already sent
        err = from_exception(exc)
        yield _event("error", {"error": error_body(err.status, err.message, path=ROUTE, wording=err.wording)["error"]})
    finally:
        await samples.aclose()  # type: ignore[attr-defined] - aborts the request if the client went away


@router.post(f"{ROUTE}/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request):
    """The prompt's tokens as this model renders the request (its chat template, tools and images), as Anthropic's."""
    state: ServerState = request.app.state.ortinf
    field_policy.apply(f"{ROUTE}/count_tokens", body)
    model = await state.model(body.model, request)
    model.require_engine()
    chat = chat_request(body, state.config.hosted_tools, [])
    tools = tool_plan(model, chat, state.config.default_tool_choice)

    def count() -> int:
        images = model.chat.images(chat.messages, state.config.media_policy) if model.chat is not None else []
        return count_prompt_tokens(model, render_prompt(model, chat, tools), images)

    tokens = await prepare_off_loop(state.admission, count, model.chat is not None and model.chat.has_images(chat.messages), 1)
    return {"input_tokens": tokens}


__all__ = ["MessagesRequest", "chat_request", "router"]
