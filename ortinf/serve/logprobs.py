"""Logprobs in OpenAI's two shapes: legacy completions and chat completions."""

from __future__ import annotations

from collections.abc import Sequence

from ortinf.runtime.worker.scheduler_output import TokenLogprobs
from ortinf.serve.models import ServedModel


def completion_logprobs(model: ServedModel, entries: Sequence[TokenLogprobs | None], start_offset: int = 0) -> dict:
    """{"tokens", "token_logprobs", "top_logprobs", "text_offset"}; None entries (the first prompt
    token) have no logprob."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = start_offset
    for entry in entries:
        if entry is None:
            continue
        text = model.token_text(entry.token_id)
        tokens.append(text)
        token_logprobs.append(entry.logprob)
        top.append({model.token_text(t): lp for t, lp in zip(entry.top_ids, entry.top_logprobs)} if entry.top_ids else None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def echo_logprobs(model: ServedModel, prompt_ids: Sequence[int], prompt: Sequence[TokenLogprobs | None] | None,
                  output: Sequence[TokenLogprobs]) -> dict:
    """Completion logprobs over prompt + output tokens (echo)."""
    body = completion_logprobs(model, list(prompt or [])[1:] + list(output))
    first = model.token_text(prompt_ids[0])
    body["tokens"].insert(0, first)
    body["token_logprobs"].insert(0, None)
    body["top_logprobs"].insert(0, None)
    body["text_offset"] = [0] + [o + len(first) for o in body["text_offset"]]
    return body


def chat_logprobs(model: ServedModel, entries: Sequence[TokenLogprobs]) -> dict:
    """{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}."""
    content = []
    for entry in entries:
        text = model.token_text(entry.token_id)
        top = [{"token": model.token_text(t), "logprob": lp, "bytes": model.token_bytes(t)}
               for t, lp in zip(entry.top_ids, entry.top_logprobs)]
        content.append({"token": text, "logprob": entry.logprob, "bytes": model.token_bytes(entry.token_id), "top_logprobs": top})
    return {"content": content}


def prompt_logprobs(model: ServedModel, entries: Sequence[TokenLogprobs | None] | None) -> list[dict | None] | None:
    """vLLM's prompt_logprobs field: per prompt token (None for the first), {token id: {logprob, rank,
    decoded_token}} for the prompt's token and the top alternatives."""
    if entries is None:
        return None
    body: list[dict | None] = []
    for entry in entries:
        if entry is None:
            body.append(None)
            continue
        ranked = {entry.token_id: (entry.logprob, entry.rank)}
        for rank, (token, logprob) in enumerate(zip(entry.top_ids, entry.top_logprobs), start=1):
            ranked.setdefault(token, (logprob, rank))
        body.append({str(token): {"logprob": logprob, "rank": rank, "decoded_token": model.token_text(token)}
                     for token, (logprob, rank) in ranked.items()})
    return body
