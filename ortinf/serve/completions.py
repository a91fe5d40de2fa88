"""POST /v1/completions."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortinf.runtime.engine.llm_engine import PreparedRequest
from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.serve import field_policy, responses
from ortinf.serve.errors import APIError
from ortinf.serve.logprobs import completion_logprobs, echo_logprobs, prompt_logprobs
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import CompletionRequest, SamplingFields
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import admit_and_run, merged, sse_stream

router = APIRouter()


def prepare_samples(model: ServedModel, prompts: list, body_params, n: int, stream: bool, body: SamplingFields | None = None,
                    add_special_tokens: bool = True, images: list | None = None, cache_salt: str | None = None) -> list[PreparedRequest]:
    """One PreparedRequest per prompt x sample (prompt-major); validation happens here, before any runs.
    A stream's engine outputs are deltas (each only what is new), which the route frames; a
    non-streamed request's is one final output per sample (no per-step wake-up, no text rebuilt).
    `body`: the request, for its priority and cache_salt (`cache_salt`: a route's salt without such a body, the
    Responses API's); `images`: a chat's images (one prompt), in order."""
    engine = model.require_engine().engine
    priority, salt = (body.priority, body.cache_salt) if body is not None else (0, cache_salt)
    prepared = []
    for prompt in prompts:
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        # tokenised and checked once per prompt
        first = engine.prepare(prompt, body_params, model.lora_name, add_special_tokens=add_special_tokens, priority=priority,
                               cache_salt=salt, images=images or (), output_kind="delta" if stream else "final_only")
        if first.params.num_beams > 1:  # one beam search gives the n samples (ortinf/tasks/beams.py)
            prepared += [first] * n
        else:
            prepared += [replace(first, params=first.params.for_sample(j)) for j in range(n)]
    return prepared


def usage(prepared: list[PreparedRequest], n: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """OpenAI's usage; prompt_tokens_details.cached_tokens is the prefix-cache hit of each prompt's first sample."""
    prompt_tokens = sum(p.num_prompt_tokens for p in prepared[::n])
    body = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


def cached_tokens(outputs: list[RequestOutput], n: int) -> int:
    return sum(o.num_cached_tokens or 0 for o in outputs[::n])


def request_ids(prefix: str, body: SamplingFields) -> tuple[str, str]:
    """(the response's id, the engine's id for its samples): the client's request_id names the response;
    the engine's id adds a random part, so two clients sending the same request_id never collide."""
    suffix = uuid.uuid4().hex
    if body.request_id is None:
        return f"{prefix}-{suffix}", f"{prefix}-{suffix}"
    return f"{prefix}-{body.request_id}", f"{prefix}-{body.request_id}-{suffix[:12]}"


@router.post("/v1/completions", response_model=responses.Completion,
             responses={200: {"description": "a completion, or with stream=true server-sent events of completion chunks"}})
async def create_completion(body: CompletionRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    ignored = field_policy.apply("/v1/completions", body)
    body.check_unimplemented()
    model = state.registry.get(body.model)
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
    return JSONResponse(responses.body(responses.Completion.model_validate({
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
