"""POST /v1/chat/completions."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortinf.runtime.engine import PreparedRequest
from ortinf.runtime.tokenizer import check_unicode
from ortinf.serve.completions import prepare_samples, usage
from ortinf.serve.errors import APIError
from ortinf.serve.logprobs import chat_logprobs
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import ChatCompletionRequest
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import admit_and_run, merged, sse_stream

router = APIRouter()


def render_prompt(model: ServedModel, body: ChatCompletionRequest) -> list[int]:
    """The conversation through the package's chat template, as token ids."""
    if model.chat_template is None or model.tokenizer is None:
        raise APIError(400, f"model '{model.name}' has no chat template: use /v1/completions", param="messages")
    if body.tools:
        raise APIError(400, "tools are not supported", param="tools")
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    text = model.chat_template.render(messages)
    # the template writes the special tokens (BOS, role markers) itself
    return model.tokenizer.encode(check_unicode(text, "messages"), add_special_tokens=False).ids


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    model = state.registry.get(body.model)
    engine = model.require_engine()
    logprobs = body.logprobs_count()
    params = body.sampling_params(body.max_new_tokens(), logprobs)
    # rendering and tokenising are CPU work: off the event loop, which serves every other client
    prepared = await asyncio.to_thread(lambda: prepare_samples(model, [render_prompt(model, body)], params, body.n))
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())
    stream = _stream(state, model, body, prepared, request_id, created) if body.stream else None
    outputs = await admit_and_run(request, state.admission, engine, prepared, request_id, stream)
    if body.stream:
        return outputs
    choices = []
    for index, output in enumerate(outputs):
        completion = output.outputs[0]
        choices.append({
            "index": index,
            "message": {"role": "assistant", "content": completion.text},
            "logprobs": chat_logprobs(model, completion.logprobs or []) if logprobs is not None else None,
            "finish_reason": completion.finish_reason,
        })
    completion_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return JSONResponse({
        "id": request_id, "object": "chat.completion", "created": created, "model": model.name,
        "choices": choices, "usage": usage(prepared, body.n, completion_tokens),
    })


def _stream(state: ServerState, model: ServedModel, body: ChatCompletionRequest, prepared: list[PreparedRequest],
            request_id: str, created: int) -> AsyncIterator[str]:
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model.name}
    completion_tokens = [0] * len(prepared)

    def choice(index: int, delta: dict, logprobs: dict | None = None, finish_reason: str | None = None) -> dict:
        return {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}

    async def chunks() -> AsyncIterator[dict]:
        sent_text = [0] * len(prepared)
        sent_logprobs = [0] * len(prepared)
        for index in range(len(prepared)):  # the role comes first, before any content
            yield choice(index, {"role": "assistant", "content": ""})
        async for index, output in merged(model.require_engine(), prepared, request_id):
            completion = output.outputs[0]
            delta_text = completion.text[sent_text[index]:]
            sent_text[index] = len(completion.text)
            new_tokens = len(completion.token_ids) - completion_tokens[index]
            completion_tokens[index] = len(completion.token_ids)
            logprobs = None
            if body.logprobs:
                entries = (completion.logprobs or [])[sent_logprobs[index]:]
                sent_logprobs[index] += len(entries)
                logprobs = chat_logprobs(model, entries) if entries else None
            if delta_text or logprobs or (new_tokens and not completion.finish_reason):
                yield choice(index, {"content": delta_text}, logprobs)
            if completion.finish_reason:
                yield choice(index, {}, finish_reason=completion.finish_reason)

    def last() -> dict | None:
        if not body.include_usage():
            return None
        return {**head, "choices": [], "usage": usage(prepared, body.n, sum(completion_tokens))}

    return sse_stream(chunks(), last)
