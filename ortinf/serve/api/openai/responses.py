"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API, what the openai Agents
SDK and newer openai code call first.

A front over chat completions, not a second path: the input items (messages, function calls and
their outputs) and `instructions` become a chat conversation, `tools` and `tool_choice` a tool plan
(ortinf/tasks/chat/tools.py), `text.format` the structured output, and the request then runs exactly as
a chat completion (the template, the tool-call parser, the engine). The reply's text and calls
become output items; streamed, they are the Responses events (`response.output_text.delta`, ...).

Stored responses (`store`, default true as OpenAI's) live in an in-memory store bounded in bytes
(ortinf/serve/api/openai/responses_store.py: immutable JSON snapshots, oldest evicted first, gone when the server
stops). `previous_response_id` continues a stored one's conversation (its input and output items; its
instructions are not carried, as OpenAI's).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ortinf.serve import field_policy
from ortinf.serve.admission import AdmittedStream, prepare_off_loop
from ortinf.serve.api.openai.responses_store import ResponseStore
from ortinf.serve.api.openai.responses_tools import ResponsesTools, read_tools
from ortinf.serve.errors import APIError, from_exception
from ortinf.serve.generation import as_chat_request, chat_params, prepare_samples, render_prompt, split_reasoning, tool_plan
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import OPEN, ChatCompletionRequest, Finite, read_guided
from ortinf.serve.sse import sse
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import final_outputs, merged, until_disconnected
from ortinf.tasks.chat.tools import ToolCall, ToolPlan, held_back

router = APIRouter()

MAX_ITEMS = 2048  # input items in one request
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512  # OpenAI's limits on metadata


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    description: str | None = None
    json_schema: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: TextFormat | None = None
    verbosity: str | None = Field(None, description="accepted; no verbosity control")


class NamedTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str


class ResponsesRequest(BaseModel):
    """POST /v1/responses."""

    model_config = OPEN

    model: str | None = None
    input: str | Annotated[list[dict], Field(max_length=MAX_ITEMS)]
    instructions: str | None = None
    tools: Annotated[list[dict], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedTool | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    temperature: Annotated[Finite, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[Finite, Field(gt=0.0, le=1.0)] | None = None
    max_output_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool = True
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None
    user: str | None = None
    structured_outputs: dict | None = Field(None, description="vLLM's, as on chat completions (json, regex, choice, grammar)")
    cache_salt: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        None, description="vLLM's: prefix-cache blocks are shared only between requests with the same salt")

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        """OpenAI's: keys up to 64 characters, values up to 512."""
        for key, value in (metadata or {}).items():
            if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
                raise ValueError(f"metadata keys are at most {MAX_METADATA_KEY} characters and values at most "
                                 f"{MAX_METADATA_VALUE} (OpenAI's limits)")
        return metadata

    @model_validator(mode="before")
    @classmethod
    def _guided(cls, data):
        """vLLM's guided_* fields, read as structured_outputs (as on chat completions)."""
        return read_guided(data)


def _text(content, where: str) -> str | list[dict]:
    """An item's content as chat content: its text (a string, or input_text / output_text parts), or with
    input_image parts a list of chat parts (image_url), which a vision-language model reads and a text model refuses."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where}: content must be a string or a list of parts", param="input")
    parts: list[dict] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            continue
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url"), "detail": part.get("detail")}})
        else:
            raise APIError(400, f"{where}: content parts of type '{str(kind)[:40]}' are not supported: send input_text or "
                                "input_image parts", param="input")
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def conversation(body: ResponsesRequest, previous: list[dict], tools: ResponsesTools | None = None) -> list[dict]:
    """The chat messages of a request: the previous response's conversation, then the input items (a call of a
    namespace's function under the name the model knows it by, `tools`). `previous` is not changed (a stored
    conversation is read as a fresh copy anyway)."""
    messages = list(previous)
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    for index, item in enumerate(items):
        where = f"input.{index}"
        if not isinstance(item, dict):
            raise APIError(400, f"{where}: an item must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"{where}: role must be user, system, developer or assistant", param="input")
            messages.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise APIError(400, f"{where}: a function_call item needs name and call_id", param="input")
            name = tools.model_name(item["name"], item.get("namespace")) if tools is not None else item["name"]
            call = {"id": item["call_id"], "type": "function", "function": {"name": name, "arguments": str(item.get("arguments") or "{}")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # a reply's message and calls are one assistant turn
                messages[-1] = {**last, "tool_calls": [*(last.get("tool_calls") or []), call]}
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            # Codex also sends outputs no call asked for (a goal's objective): call_id absent, a name and namespace instead
            call_id = item.get("call_id") if item.get("call_id") is not None else item.get("name")
            if not isinstance(call_id, str):
                raise APIError(400, f"{where}: a function_call_output item needs call_id", param="input")
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": output if isinstance(output, str) else _text(output, where)})
        elif kind == "reasoning":
            continue  # a reasoning model's summary: nothing this model reads
        else:
            raise APIError(400, f"{where}: items of type '{str(kind)[:40]}' are not supported (message, function_call, "
                                "function_call_output)", param="input")
    return messages


_RESPONSES_NAME = {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format"}  # chat's names


def chat_request(body: ResponsesRequest, messages: list[dict], tools: ResponsesTools) -> ChatCompletionRequest:
    """The chat completion this response runs as."""
    fields: dict = {"model": body.model, "messages": messages, "tools": tools.chat,
                    "parallel_tool_calls": body.parallel_tool_calls, "temperature": body.temperature, "top_p": body.top_p,
                    "max_completion_tokens": body.max_output_tokens}
    if body.tool_choice is not None and (tools.chat or body.tool_choice not in ("auto", "none")):  # auto/none without tools: no-ops
        choice = body.tool_choice
        fields["tool_choice"] = choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
    if body.structured_outputs is not None:
        fields["structured_outputs"] = body.structured_outputs
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise APIError(400, "text.format of type json_schema needs a schema", param="text.format.schema")
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.json_schema}}
    elif fmt is not None:
        fields["response_format"] = {"type": fmt.type}
    return as_chat_request(fields, _RESPONSES_NAME)  # errors named as the Responses request names them


def _message_item(text: str) -> dict:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(call: ToolCall) -> dict:
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": "completed"}


def _reasoning_item(text: str) -> dict:
    return {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": text}]}


def _outputs(reasoning: str | None, content: str | None, calls: list[ToolCall]) -> list[dict]:
    items = [_reasoning_item(reasoning)] if reasoning is not None else []
    items += [_message_item(content)] if content else []
    return items + [_call_item(call) for call in calls]


@dataclass(slots=True)
class Run:
    """One response in the making: its request, tool plan, samples and bookkeeping."""

    body: ResponsesRequest
    tools: ToolPlan
    model: ServedModel
    prepared: list
    response_id: str
    created: int
    messages: list[dict]
    names: ResponsesTools

    def response(self, status: str, output: list[dict], usage: dict | None, incomplete: str | None = None) -> dict:
        body = self.body
        fmt = body.text.format.model_dump(by_alias=True, exclude_none=True) if body.text and body.text.format else {"type": "text"}
        choice = body.tool_choice if isinstance(body.tool_choice, str) or body.tool_choice is None else body.tool_choice.model_dump()
        return {
            "id": self.response_id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model.name, "output": output, "usage": usage, "error": None,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": body.instructions, "metadata": body.metadata or {}, "parallel_tool_calls": body.parallel_tool_calls,
            "temperature": body.temperature, "top_p": body.top_p, "max_output_tokens": body.max_output_tokens,
            "previous_response_id": body.previous_response_id, "tool_choice": choice or "auto", "tools": body.tools or [],
            "text": {"format": fmt}, "store": body.store, "truncation": "disabled", "reasoning": None, "user": body.user,
            "service_tier": "default",
        }

    def finish(self, store: ResponseStore, text: str, finish_reason: str | None, usage: dict,
               item_ids: dict[str, str] | None = None) -> dict:
        """The final response, stored (a snapshot) when the request asked. `item_ids`: the ids a stream
        announced for its reasoning and message items, by item type."""
        reasoning, answer = split_reasoning(self.model, text)
        incomplete = "max_output_tokens" if finish_reason == "length" else None
        # a call max_output_tokens cut is a function_call item with the arguments produced so far (ToolPlan.parse), never
        # a completed message holding the grammar's partial JSON
        content, calls = self.tools.parse(answer, self.model.tool_parser, cut=bool(incomplete)) if answer is not None else (None, [])
        output = [self.names.call_item(item) if item["type"] == "function_call" else item for item in _outputs(reasoning, content, calls)]
        for item in output:
            if incomplete and item["type"] == "function_call":
                item["status"] = "incomplete"
        for item in output:
            item["id"] = (item_ids or {}).get(item["type"], item["id"])
        body = self.response("incomplete" if incomplete else "completed", output, usage, incomplete)
        if self.body.store:
            reply = {"role": "assistant", "content": content}
            if calls:
                reply["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                       for c in calls]
            # the stored conversation leaves the instructions out (they are not carried to the next response)
            kept = self.messages[1:] if self.body.instructions is not None else self.messages
            store.put(self.response_id, body, [*kept, reply])
        return body


def _usage(run: Run, output_tokens: int, cached: int) -> dict:
    prompt = sum(p.num_prompt_tokens for p in run.prepared)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + output_tokens}


@router.post("/v1/responses", responses={200: {"description": "a response, or with stream=true its server-sent events"}})
async def create_response(body: ResponsesRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    ignored = field_policy.apply("/v1/responses", body)
    model = await state.model(body.model, request)
    engine = model.require_engine()
    store = state.responses
    previous = store.get(body.previous_response_id, "previous_response_id").conversation() if body.previous_response_id else []
    declared = read_tools(body.tools, state.config.hosted_tools)
    ignored += declared.ignored
    messages = conversation(body, previous, declared)
    if body.instructions is not None:
        messages.insert(0, {"role": "system", "content": body.instructions})
    if not messages:
        raise APIError(400, "input is empty: send a string or at least one item", param="input")
    chat = chat_request(body, messages, declared)
    tools = tool_plan(model, chat, state.config.default_tool_choice)
    params = chat_params(model, chat, tools, None)
    def prepare() -> list:  # rendering, tokenising and decoding images are CPU work: off the event loop
        images = model.images(chat.messages, state.config.media_policy)
        return prepare_samples(model, [render_prompt(model, chat, tools)], params, 1, body.stream, images=images,
                               cache_salt=body.cache_salt)

    prepared = await prepare_off_loop(state.admission, prepare, model.has_images(chat.messages), 1)
    run = Run(body, tools, model, prepared, f"resp_{uuid.uuid4().hex}", int(time.time()), messages, declared)
    headers = field_policy.response_headers(ignored, tools.warning)
    ticket = state.admission.acquire(1)
    if body.stream:
        stream = AdmittedStream(_events(run, store, engine), ticket)
        stream.headers.update(headers)
        return stream
    try:
        (output,) = await until_disconnected(request, final_outputs(engine, prepared, run.response_id))
    finally:
        ticket.release()
    completion = output.outputs[0]
    response = run.finish(store, completion.text, completion.finish_reason,
                          _usage(run, len(completion.token_ids), output.num_cached_tokens or 0))
    return JSONResponse(response, headers=headers)


async def _events(run: Run, store: ResponseStore, engine) -> AsyncIterator[str]:  # the AsyncEngine
    """The Responses stream: created, in_progress, the thinking of a reasoning item (with a reasoning
    parser), the text deltas of one message item, the function calls once the reply is read, then
    completed (or incomplete; an error event and failed if anything went wrong)."""
    sequence = 0

    def event(kind: str, **data) -> str:
        nonlocal sequence
        sequence += 1
        return f"event: {kind}\ndata: {_json({'type': kind, 'sequence_number': sequence - 1, **data})}\n\n"

    yield event("response.created", response=run.response("in_progress", [], None))
    yield event("response.in_progress", response=run.response("in_progress", [], None))
    thinking = _reasoning_item("")
    message = _message_item("")
    text, sent, said = "", 0, 0  # the output so far; answer and thinking characters sent
    stage = "start"  # -> "thinking" (a reasoning item is open) -> "closed" -> "message" (the message item is open)
    samples = merged(engine, run.prepared, run.response_id)
    try:
        async for _, output in samples:
            delta = output.outputs[0]
            text += delta.text
            finished = bool(delta.finish_reason)
            reasoning, answer = split_reasoning(run.model, text, finished)
            if reasoning is not None and stage == "start":
                stage = "thinking"
                yield event("response.output_item.added", output_index=0, item={**thinking, "status": "in_progress", "content": []})
            if stage == "thinking" and reasoning is not None and len(reasoning) > said:
                yield event("response.reasoning_text.delta", item_id=thinking["id"], output_index=0, content_index=0,
                            delta=reasoning[said:])
                said = len(reasoning)
            if stage == "thinking" and (answer is not None or finished):
                stage = "closed"
                thinking["content"][0]["text"] = reasoning or ""
                yield event("response.reasoning_text.done", item_id=thinking["id"], output_index=0, content_index=0, text=reasoning or "")
                yield event("response.output_item.done", output_index=0, item=thinking)
            answer = answer or ""
            if finished:
                response = run.finish(store, text, delta.finish_reason, _usage(run, output.num_output_tokens, output.num_cached_tokens or 0),
                                      item_ids={"reasoning": thinking["id"], "message": message["id"]})  # the ids the stream announced
                items = response["output"]
                final = next((item for item in items if item["type"] == "message"), None)
                visible = len(final["content"][0]["text"]) if final is not None else sent
                answer = final["content"][0]["text"] if final is not None else answer
            else:
                visible = held_back(answer, run.tools.mode, run.model.tool_parser)
            index = 1 if stage == "closed" else 0
            if visible > sent:
                if stage != "message":
                    stage = "message"
                    yield event("response.output_item.added", output_index=index, item={**message, "status": "in_progress", "content": []})
                    yield event("response.content_part.added", item_id=message["id"], output_index=index, content_index=0,
                                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
                yield event("response.output_text.delta", item_id=message["id"], output_index=index, content_index=0,
                            delta=answer[sent:visible], logprobs=[])
                sent = visible
            if not finished:
                continue
            for position, item in enumerate(items):
                if item["type"] == "message":
                    part = item["content"][0]
                    yield event("response.output_text.done", item_id=item["id"], output_index=position, content_index=0,
                                text=part["text"], logprobs=[])
                    yield event("response.content_part.done", item_id=item["id"], output_index=position, content_index=0, part=part)
                    yield event("response.output_item.done", output_index=position, item=item)
                elif item["type"] == "function_call":
                    yield event("response.output_item.added", output_index=position, item={**item, "arguments": "", "status": "in_progress"})
                    yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=position,
                                delta=item["arguments"])
                    yield event("response.function_call_arguments.done", item_id=item["id"], output_index=position,
                                arguments=item["arguments"], name=item["name"])
                    yield event("response.output_item.done", output_index=position, item=item)
            kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
            yield event(kind, response=response)
    except Exception as exc:  # noqa: BLE001 - reported in the stream, whose headers are already sent
        err = from_exception(exc)
        yield event("error", code=err.code, message=err.message, param=err.param)
        yield event("response.failed", response={**run.response("failed", [], None),
                                                 "error": {"code": err.code or "server_error", "message": err.message}})
    finally:
        await samples.aclose()  # type: ignore[attr-defined] - aborts the request if the client went away


def _json(data: dict) -> str:
    return sse(data)[len("data: "):-2]


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request):
    return JSONResponse(request.app.state.ortinf.responses.get(response_id).response())


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request):
    store: ResponseStore = request.app.state.ortinf.responses
    store.get(response_id)  # 404 when absent
    store.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
