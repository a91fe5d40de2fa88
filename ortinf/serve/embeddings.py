"""POST /v1/embeddings.

Inputs are tokenised off the event loop and checked (length, vocabulary) before anything runs; then each is
a request of the model's PoolingEngine (ortinf/tasks/pooling.py), batched with every other request's inputs
under the engine's step budget, in length order (a request of 2,048 inputs where one is 512 tokens long never
pads the other 2,047 to 512).
"""

from __future__ import annotations

import asyncio
import base64
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortinf.serve import field_policy, responses
from ortinf.serve.errors import APIError
from ortinf.serve.protocol import EmbeddingRequest
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import until_disconnected

router = APIRouter()


@router.post("/v1/embeddings", response_model=responses.EmbeddingList)
async def create_embeddings(body: EmbeddingRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    ignored = field_policy.apply("/v1/embeddings", body)
    model = state.registry.get(body.model)
    pooling = model.require_embeddings()
    dim = pooling.spec.embedding_dim
    if body.dimensions is not None and body.dimensions > dim:
        raise APIError(400, f"dimensions ({body.dimensions}) is more than this model's {dim}: ask for at most {dim}", param="dimensions")
    items = body.input
    if isinstance(items, str) or (items and all(isinstance(t, int) for t in items)):
        items = [items]
    ticket = state.admission.acquire(1)
    try:
        token_ids = await asyncio.to_thread(pooling.embedding_inputs, items, body.truncate_prompt_tokens)
        vectors = await until_disconnected(request, pooling.run_async(model.pooler, token_ids, request_id=f"embd-{uuid.uuid4().hex}"))
    finally:
        ticket.release()
    if body.dimensions is not None and body.dimensions < vectors.shape[1]:
        vectors = pooling.shortened(vectors, body.dimensions, pooling.spec.normalize)
    data = []
    for index, vector in enumerate(vectors):
        embedding = base64.b64encode(vector.tobytes()).decode() if body.encoding_format == "base64" else vector.tolist()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    num_tokens = sum(len(ids) for ids in token_ids)
    return JSONResponse(responses.body(responses.EmbeddingList.model_validate(
        {"object": "list", "data": data, "model": model.name, "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})),
        headers=field_policy.ignored_headers(ignored))
