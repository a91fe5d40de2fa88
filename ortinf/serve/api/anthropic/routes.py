"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, as a front-end over the chat path.

A request is read into the chat completion it means (convert.py: system, turns, images, tool_use and tool_result blocks as
OpenAI's messages; tools and tool_choice as OpenAI's), so the same Chat renders it, the same tool plan constrains
or parses the calls and the same reasoning parser splits the thinking; only the framing is Anthropic's: content
blocks, stop_reason, usage, and the typed stream events (message_start, content_block_start/delta/stop,
message_delta, message_stop). Errors on these paths are Anthropic-shaped (ortinf/serve/errors.py), and the API
key may come as `x-api-key` (ortinf/serve/app.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.serve import field_policy
from ortinf.serve.admission import AdmittedStream, prepare_off_loop, sequences
from ortinf.serve.api.anthropic.convert import chat_request
from ortinf.serve.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from ortinf.serve.errors import APIError, error_body, from_exception
from ortinf.serve.generation import Reply, chat_params, count_prompt_tokens, prepare_samples, render_prompt, tool_plan
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import ChatCompletionRequest
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import final_outputs, merged, until_disconnected
from ortinf.tasks.chat.tools import ToolCall, ToolPlan

router = APIRouter()
ROUTE = "/v1/messages"


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
        images = model.images(chat.messages, state.config.media_policy)
        return prepare_samples(model, [render_prompt(model, chat, tools)], params, 1, body.stream, images=images,
                               cache_salt=salt)

    prepared = await prepare_off_loop(state.admission, prepare, model.has_images(chat.messages), 1)
    return model, chat, tools, prepared, ignored


@router.post(ROUTE, responses={200: {"description": "a message, or with stream=true its server-sent events"}})
async def create_message(body: MessagesRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    model, chat, tools, prepared, ignored = await _prepared(body, state, request)
    message_id = f"msg_{uuid.uuid4().hex}"
    headers = field_policy.response_headers(ignored, tools.warning)
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
        images = model.images(chat.messages, state.config.media_policy)
        return count_prompt_tokens(model, render_prompt(model, chat, tools), images)

    tokens = await prepare_off_loop(state.admission, count, model.has_images(chat.messages), 1)
    return {"input_tokens": tokens}


__all__ = ["router"]
