"""What the embedding routes share (OpenAI's /v1/embeddings, Ollama's /api/embed and /api/embeddings): inputs
tokenised off the event loop and checked (length, vocabulary) before anything runs, then each a request of the
model's PoolingEngine (ortinf/tasks/pooling.py), batched with every other request's inputs, under admission."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import numpy as np
from starlette.requests import Request

from ortinf.serve.errors import APIError
from ortinf.serve.models import ServedModel
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import until_disconnected


async def embed(request: Request, state: ServerState, model: ServedModel, items: Sequence[str | Sequence[int]], truncate: int | None,
                dimensions: int | None) -> tuple[np.ndarray, int]:
    """(one row per input, shortened to `dimensions` when asked, the inputs' tokens). `truncate`: keep at most this many
    tokens of each input (None: an input past the context length is a 400)."""
    pooling = model.require_embeddings()
    dim = pooling.spec.embedding_dim
    if dimensions is not None and dimensions > dim:
        raise APIError(400, f"dimensions ({dimensions}) is more than this model's {dim}: ask for at most {dim}", param="dimensions")
    ticket = state.admission.acquire(1)
    try:
        token_ids = await asyncio.to_thread(pooling.embedding_inputs, items, truncate)
        vectors = await until_disconnected(request, pooling.run_async(model.engine, token_ids, request_id=f"embd-{uuid.uuid4().hex}"))
    finally:
        ticket.release()
    if dimensions is not None and dimensions < vectors.shape[1]:
        vectors = pooling.shortened(vectors, dimensions, pooling.spec.normalize)
    return vectors, sum(len(ids) for ids in token_ids)


__all__ = ["embed"]
