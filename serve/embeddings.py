"""POST /v1/embeddings."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortinf.serve.errors import APIError
from ortinf.serve.protocol import EmbeddingRequest
from ortinf.serve.state import ServerState

router = APIRouter()


def _token_lists(body: EmbeddingRequest, encode) -> list[list[int]]:
    items = body.input
    if isinstance(items, str):
        items = [items]
    elif items and all(isinstance(t, int) for t in items):
        items = [items]
    texts = [item for item in items if isinstance(item, str)]
    if any(not text for text in texts):
        raise APIError(400, "input strings must not be empty", param="input")
    return [encode([item])[0] if isinstance(item, str) else list(item) for item in items]


@router.post("/v1/embeddings")
async def create_embeddings(body: EmbeddingRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    model = state.registry.get(body.model)
    encoder = model.require_embeddings()
    if body.dimensions is not None and body.dimensions != encoder.spec.embedding_dim:
        raise APIError(400, f"this model's embeddings have {encoder.spec.embedding_dim} dimensions", param="dimensions")
    token_ids = _token_lists(body, encoder.encode)
    state.admission.acquire(1)
    try:
        vectors = await model.embed(token_ids)
    finally:
        state.admission.release(1)
    data = []
    for index, vector in enumerate(np.asarray(vectors, dtype=np.float32)):
        embedding = base64.b64encode(vector.tobytes()).decode() if body.encoding_format == "base64" else vector.tolist()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    num_tokens = sum(len(ids) for ids in token_ids)
    return JSONResponse({"object": "list", "data": data, "model": model.name,
                         "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})
