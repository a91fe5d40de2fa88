"""POST /v1/completions for text2text-generation packages (Marian, BART; runtime/seq2seq.py): each
prompt is a source (text through the package's tokenizer, or token ids), its completion the model's
output. The sources of every request in flight decode together (runtime/async_loop.py AsyncSeq2Seq).

What a completion request may set here: prompt (one or many), max_tokens, temperature (0 or absent:
greedy; else sampled), seed, n = 1, user. Anything else (stream, logprobs, stop, penalties, echo, ...)
is a 400 that names it: those are built for the text decoders' engine, not for this loop.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi.responses import JSONResponse

from ortinf.runtime.tokenizer import check_unicode
from ortinf.serve.errors import APIError
from ortinf.serve.protocol import CompletionRequest

ALLOWED = {"model", "prompt", "max_tokens", "temperature", "seed", "user", "n"}


_LONGEST: dict[int, int] = {}  # id(tokenizer) -> its longest vocabulary entry, in characters


def max_source_chars(tokenizer, limit: int) -> int:  # noqa: ANN001 - a tokenizers.Tokenizer
    """More characters than any tokenization of `limit` tokens can take (2x the longest entry per token,
    for normalizers that expand text), as the text engine bounds prompts before tokenizing them."""
    key = id(tokenizer)
    if key not in _LONGEST:
        _LONGEST[key] = max((len(t) for t in tokenizer.get_vocab()), default=16)
    return limit * 2 * max(_LONGEST[key], 1)


async def text2text_completion(body: CompletionRequest, model, state) -> JSONResponse:  # noqa: ANN001
    for name in sorted(body.model_fields_set - ALLOWED):
        if getattr(body, name) != CompletionRequest.model_fields[name].default:
            raise APIError(400, f"{name} is not supported for text2text-generation models (prompt, max_tokens, temperature, "
                                "seed and n=1 are)", param=name)
    if body.n != 1:
        raise APIError(400, "n must be 1 for text2text-generation models", param="n")
    runner = model.seq2seq.runner
    prompts = body.prompts()
    if not prompts or any(not p for p in prompts):
        raise APIError(400, "the prompt is empty", param="prompt")
    if any(isinstance(p, str) for p in prompts) and runner.tokenizer is None:
        raise APIError(400, "this model has no tokenizer.json (Marian's SentencePiece has no fast form): send token ids", param="prompt")
    limit = runner.spec.max_source_positions
    for p in prompts:
        if isinstance(p, str):  # before the tokenizer: lone surrogates, and megabytes no tokenization fits
            check_unicode(p, "prompt")
            if len(p) > max_source_chars(runner.tokenizer, limit):
                raise APIError(400, f"a source must hold 1 to {limit} tokens: {len(p)} characters is more than {limit} tokens "
                                    "of this tokenizer can hold", param="prompt")
    sources = await asyncio.to_thread(lambda: [runner.tokenizer.encode(p).ids if isinstance(p, str) else list(p) for p in prompts])
    max_tokens = body.max_tokens
    if max_tokens == 0:
        raise APIError(400, "max_tokens must be at least 1 for text2text-generation models", param="max_tokens")
    temperature = 0.0 if body.temperature is None or body.temperature < 1e-5 else body.temperature
    ticket = state.admission.acquire(len(sources))
    started, failed = time.monotonic(), True
    try:
        seed = None if body.seed is None else body.seed % 2**64  # any integer, as the text routes map it
        outputs = await model.seq2seq.generate(sources, max_tokens, temperature, seed)
        failed = False
    finally:
        ticket.release()
        state.metrics.observe_request(model.name, time.monotonic() - started, failed)
    budget = max_tokens or runner.manifest.decoder.max_model_len - 1
    texts = await asyncio.to_thread(lambda: [runner.tokenizer.decode(ids, skip_special_tokens=True) if runner.tokenizer else ""
                                             for ids in outputs])
    choices = [{"index": i, "text": text, "logprobs": None, "finish_reason": "length" if len(ids) >= budget else "stop",
                "token_ids": ids} for i, (text, ids) in enumerate(zip(texts, outputs))]
    prompt_tokens, completion_tokens = sum(len(s) for s in sources), sum(len(o) for o in outputs)
    return JSONResponse({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                         "model": model.name, "choices": choices,
                         "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                   "total_tokens": prompt_tokens + completion_tokens}})
