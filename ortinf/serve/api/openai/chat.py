"""POST /v1/chat/completions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortinf.runtime.engine.prepared import PreparedRequest
from ortinf.serve import field_policy
from ortinf.serve.admission import admit_and_run, prepare_off_loop
from ortinf.serve.api.openai import schemas
from ortinf.serve.generation import cached_tokens, chat_params, prepare_samples, render_prompt, request_ids, split_reasoning, tool_plan, usage
from ortinf.serve.logprobs import chat_logprobs, prompt_logprobs
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import ChatCompletionRequest
from ortinf.serve.sse import sse_stream
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import merged
from ortinf.tasks.chat.tools import ToolPlan, held_back

router = APIRouter()


@router.post("/v1/chat/completions", response_model=schemas.ChatCompletion,
             responses={200: {"description": "a chat completion, or with stream=true server-sent events of chat completion chunks"}})
async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    ignored = field_policy.apply("/v1/chat/completions", body)
    body.check_unimplemented()
    model = await state.model(body.model, request)
    engine = model.require_engine()
    logprobs = body.logprobs_count()
    tools = tool_plan(model, body, state.config.default_tool_choice)
    params = chat_params(model, body, tools, logprobs)

    def prepare() -> list[PreparedRequest]:  # rendering, tokenising, decoding images are CPU work: off the event loop
        images = model.images(body.messages, state.config.media_policy)
        return prepare_samples(model, [render_prompt(model, body, tools, bool(body.add_special_tokens))], params, body.n, body.stream, body,
                               images=images)

    images = model.has_images(body.messages)
    prepared = await prepare_off_loop(state.admission, prepare, images, body.n)
    request_id, engine_id = request_ids("chatcmpl", body)
    created = int(time.time())
    stream = _stream(state, model, body, tools, prepared, request_id, engine_id, created) if body.stream else None
    outputs = await admit_and_run(request, state.admission, engine, prepared, engine_id, stream)
    if body.stream:
        outputs.headers.update(field_policy.response_headers(ignored, tools.warning))
        return outputs
    choices = []
    for index, output in enumerate(outputs):
        completion = output.outputs[0]
        reasoning, answer = split_reasoning(model, completion.text)
        cut = completion.finish_reason == "length"
        content, calls = tools.parse(answer, model.tool_parser, cut) if answer is not None else (None, [])
        message: dict = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        if calls:
            message["tool_calls"] = [c.to_openai() for c in calls]
        choices.append({
            "index": index,
            "message": message,
            "logprobs": chat_logprobs(model, completion.logprobs or []) if logprobs is not None else None,
            "finish_reason": _finish_reason(completion.finish_reason, bool(calls)),
            "stop_reason": completion.stop_reason,
        })
    completion_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    response = {
        "id": request_id, "object": "chat.completion", "created": created, "model": model.name,
        "system_fingerprint": model.fingerprint, "choices": choices,
        "usage": usage(prepared, body.n, completion_tokens, cached_tokens(outputs, body.n)),
    }
    if body.prompt_logprobs is not None:
        response["prompt_logprobs"] = prompt_logprobs(model, outputs[0].prompt_logprobs)
    return JSONResponse(schemas.body(schemas.ChatCompletion.model_validate(response)), headers=field_policy.response_headers(ignored, tools.warning))



def _finish_reason(reason: str | None, called: bool) -> str | None:
    """OpenAI ends a reply that calls tools with "tool_calls"."""
    return "tool_calls" if called and reason == "stop" else reason


def _stream(state: ServerState, model: ServedModel, body: ChatCompletionRequest, tools: ToolPlan, prepared: list[PreparedRequest],
            request_id: str, engine_id: str, created: int) -> AsyncIterator[str]:
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model.name,
            "system_fingerprint": model.fingerprint}
    completion_tokens = [0] * len(prepared)
    cached = [0] * len(prepared)

    def choice(index: int, delta: dict, logprobs: dict | None = None, finish_reason: str | None = None,
               stop_reason: int | str | None = None) -> dict:
        return {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
                                     "stop_reason": stop_reason}]}

    async def chunks() -> AsyncIterator[dict]:
        sent_text = [0] * len(prepared)
        sent_reasoning = [0] * len(prepared)
        texts = [""] * len(prepared)  # each sample's text so far (the engine sends deltas)
        for index in range(len(prepared)):  # the role comes first, before any content
            yield choice(index, {"role": "assistant", "content": ""})
        async for index, output in merged(model.require_engine(), prepared, engine_id):
            delta = output.outputs[0]
            texts[index] += delta.text
            reasoning, answer = split_reasoning(model, texts[index], bool(delta.finish_reason))
            if reasoning is not None and len(reasoning) > sent_reasoning[index]:  # the thinking streams as reasoning_content
                yield choice(index, {"reasoning_content": reasoning[sent_reasoning[index]:]})
                sent_reasoning[index] = len(reasoning)
            completion = replace(delta, text=answer or "")
            # text that may belong to a tool call is held back until the output is finished
            visible = len(completion.text) if completion.finish_reason else held_back(completion.text, tools.mode, model.tool_parser)
            calls = []
            if completion.finish_reason and tools.mode != "none":
                content, calls = tools.parse(completion.text, model.tool_parser, completion.finish_reason == "length")
                if calls:
                    visible = len(content or "") if tools.mode == "auto" else 0
            delta_text = completion.text[sent_text[index]:max(visible, sent_text[index])]
            sent_text[index] = max(visible, sent_text[index])
            new_tokens = len(delta.token_ids)
            completion_tokens[index] = output.num_output_tokens
            cached[index] = output.num_cached_tokens or 0
            logprobs = None
            if body.logprobs:
                entries = delta.logprobs or []
                logprobs = chat_logprobs(model, entries) if entries else None
            if delta_text or logprobs or (new_tokens and not completion.finish_reason):
                chunk = choice(index, {"content": delta_text}, logprobs)
                if body.continuous_usage():
                    chunk["usage"] = usage(prepared, body.n, sum(completion_tokens))
                yield chunk
            if calls:
                yield choice(index, {"tool_calls": [c.to_openai(i) for i, c in enumerate(calls)]})
            if completion.finish_reason:
                yield choice(index, {}, finish_reason=_finish_reason(completion.finish_reason, bool(calls)), stop_reason=completion.stop_reason)

    def last() -> dict | None:
        if not body.include_usage():
            return None
        return {**head, "choices": [], "usage": usage(prepared, body.n, sum(completion_tokens), sum(cached[:: body.n]))}

    return sse_stream(chunks(), last)
