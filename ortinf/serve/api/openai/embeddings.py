"""POST /v1/embeddings.

Inputs are tokenised off the event loop and checked (length, vocabulary) before anything runs; then each is
a request of the model's PoolingEngine (ortinf/tasks/pooling.py), batched with every other request's inputs
under the engine's step budget, in length order (a request of 2,048 inputs where one is 512 tokens long never
pads the other 2,047 to 512).
"""

from __future__ import annotations

import base64

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortinf.serve import field_policy
from ortinf.serve.api.openai import schemas
from ortinf.serve.encoding import embed
from ortinf.serve.protocol import EmbeddingRequest
from ortinf.serve.state import ServerState

router = APIRouter()


@router.post("/v1/embeddings", response_model=schemas.EmbeddingList)
async def create_embeddings(body: EmbeddingRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    ignored = field_policy.apply("/v1/embeddings", body)
    model = await state.model(body.model, request)
    items = body.input
    if isinstance(items, str) or (items and all(isinstance(t, int) for t in items)):
        items = [items]
    vectors, num_tokens = await embed(request, state, model, items, body.truncate_prompt_tokens, body.dimensions)
    data = []
    for index, vector in enumerate(vectors):
        embedding = base64.b64encode(vector.tobytes()).decode() if body.encoding_format == "base64" else vector.tolist()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return JSONResponse(schemas.body(schemas.EmbeddingList.model_validate(
        {"object": "list", "data": data, "model": model.name, "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})),
        headers=field_policy.ignored_headers(ignored))
