"""POST /v1/completions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.runtime.engine.prepared import PreparedRequest
from ortinf.serve import field_policy
from ortinf.serve.admission import admit_and_run
from ortinf.serve.api.openai import schemas
from ortinf.serve.errors import APIError
from ortinf.serve.generation import cached_tokens, prepare_samples, request_ids, usage
from ortinf.serve.logprobs import completion_logprobs, echo_logprobs, prompt_logprobs
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import CompletionRequest
from ortinf.serve.sse import sse_stream
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import merged

router = APIRouter()


@router.post("/v1/completions", response_model=schemas.Completion,
             responses={200: {"description": "a completion, or with stream=true server-sent events of completion chunks"}})
async def create_completion(body: CompletionRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    ignored = field_policy.apply("/v1/completions", body)
    body.check_unimplemented()
    model = await state.model(body.model, request)
    engine = model.require_engine()
    prompt_logprobs = max(body.logprobs or 0, body.prompt_logprobs or 0) if body.echo else None  # echo shows the prompt's logprobs too
    params = body.sampling_params(body.max_tokens, body.logprobs, prompt_logprobs)
    prompts = body.prompts()
    if not prompts:
        raise APIError(400, "the prompt is empty", param="prompt")
    add_special = True if body.add_special_tokens is None else body.add_special_tokens
    # tokenising is CPU work
    prepared = await asyncio.to_thread(prepare_samples, model, prompts, params, body.n, body.stream, body, add_special)
    request_id, engine_id = request_ids("cmpl", body)
    created = int(time.time())
    stream = _stream(state, model, body, prepared, request_id, engine_id, created) if body.stream else None
    outputs = await admit_and_run(request, state.admission, engine, prepared, engine_id, stream)
    if body.stream:
        outputs.headers.update(field_policy.ignored_headers(ignored))
        return outputs
    choices = [_choice(model, body, p, o, i) for i, (p, o) in enumerate(zip(prepared, outputs))]
    completion_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return JSONResponse(schemas.body(schemas.Completion.model_validate({
        "id": request_id, "object": "text_completion", "created": created, "model": model.name,
        "system_fingerprint": model.fingerprint, "choices": choices,
        "usage": usage(prepared, body.n, completion_tokens, cached_tokens(outputs, body.n)),
    })), headers=field_policy.ignored_headers(ignored))


def _prompt_text(model: ServedModel, prepared: PreparedRequest) -> str:
    if prepared.text is not None:
        return prepared.text
    tokenizer = model.tokenizer
    return tokenizer.decode(prepared.token_ids, skip_special_tokens=False) if tokenizer else ""


def _choice(model: ServedModel, body: CompletionRequest, prepared: PreparedRequest, output: RequestOutput, index: int) -> dict:
    completion = output.outputs[0]
    prefix = _prompt_text(model, prepared) if body.echo else ""
    logprobs = None
    if body.logprobs is not None:
        entries = completion.logprobs or []
        if body.echo:
            logprobs = echo_logprobs(model, prepared.token_ids, output.prompt_logprobs, entries)
        else:
            logprobs = completion_logprobs(model, entries)
    choice = {"index": index, "text": prefix + completion.text, "logprobs": logprobs, "finish_reason": completion.finish_reason,
              "stop_reason": completion.stop_reason}
    if body.prompt_logprobs is not None:
        choice["prompt_logprobs"] = prompt_logprobs(model, output.prompt_logprobs)
    return choice


def _stream(state: ServerState, model: ServedModel, body: CompletionRequest, prepared: list[PreparedRequest],
            request_id: str, engine_id: str, created: int) -> AsyncIterator[str]:
    head = {"id": request_id, "object": "text_completion", "created": created, "model": model.name, "system_fingerprint": model.fingerprint}
    completion_tokens = [0] * len(prepared)
    cached = [0] * len(prepared)

    async def chunks() -> AsyncIterator[dict]:
        started = [False] * len(prepared)
        async for index, output in merged(model.require_engine(), prepared, engine_id):
            completion = output.outputs[0]  # a delta: only what is new since the previous chunk
            text = completion.text
            logprobs = None
            if body.logprobs is not None:
                entries = completion.logprobs or []
                if body.echo and not started[index]:
                    logprobs = echo_logprobs(model, prepared[index].token_ids, output.prompt_logprobs, entries)
                else:
                    logprobs = completion_logprobs(model, entries)
            if body.echo and not started[index]:
                text = _prompt_text(model, prepared[index]) + text
            started[index] = True
            new_tokens = len(completion.token_ids)
            completion_tokens[index] = output.num_output_tokens
            # one chunk per step with new tokens, even when they add no text yet (a held-back stop
            # string prefix, an incomplete character, a package without tokenizer)
            cached[index] = output.num_cached_tokens or 0
            if text or new_tokens or completion.finish_reason or logprobs:
                chunk = {**head, "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": completion.finish_reason,
                                              "stop_reason": completion.stop_reason}]}
                if body.continuous_usage():
                    chunk["usage"] = usage(prepared, body.n, sum(completion_tokens))
                yield chunk

    def last() -> dict | None:
        if not body.include_usage():
            return None
        return {**head, "choices": [], "usage": usage(prepared, body.n, sum(completion_tokens), sum(cached[:: body.n]))}

    return sse_stream(chunks(), last)
