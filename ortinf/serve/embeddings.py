"""POST /v1/embeddings.

Inputs are tokenised off the event loop, checked (length, vocabulary) before anything runs, and
embedded in chunks of similar length (never one giant padded batch): a request of 2,048 inputs
where one is 512 tokens long must not pad the other 2,047 to 512.
"""

from __future__ import annotations

import asyncio
import base64
import threading

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortinf.runtime.worker.encoder_graph import EncoderGraph
from ortinf.serve import field_policy, responses
from ortinf.serve.errors import APIError
from ortinf.serve.protocol import EmbeddingRequest
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import until_disconnected

router = APIRouter()

CHUNK = 32  # inputs per graph call


def token_lists(body: EmbeddingRequest, encoder: EncoderGraph) -> list[list[int]]:
    """Token ids of every input (text is tokenised here: call it off the event loop), checked."""
    items = body.input
    if isinstance(items, str):
        items = [items]
    elif items and all(isinstance(t, int) for t in items):
        items = [items]
    if any(isinstance(item, str) and not item for item in items):
        raise APIError(400, "input strings must not be empty", param="input")
    limit = body.truncate_prompt_tokens
    if limit is not None and limit > encoder.spec.max_model_len:
        raise APIError(400, f"truncate_prompt_tokens ({limit}) is beyond this model's context length "
                            f"{encoder.spec.max_model_len}", param="truncate_prompt_tokens")
    texts = [item for item in items if isinstance(item, str)]
    encoded = iter(encoder.encode(texts, limit) if texts else [])
    token_ids = [next(encoded) if isinstance(item, str) else list(item)[:limit] for item in items]
    encoder.check(token_ids)
    return token_ids


def embed_in_chunks(encoder: EncoderGraph, token_ids: list[list[int]], gone: threading.Event | None = None,
                    type_ids: list[list[int]] | None = None) -> np.ndarray:
    """The encoder's outputs in input order, computed in length-sorted chunks of CHUNK inputs; stops
    between chunks once `gone` is set (the client went away: issue 30, finding 9). `type_ids`: text pairs'."""
    order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))
    outputs: list[np.ndarray | None] = [None] * len(token_ids)
    for start in range(0, len(order), CHUNK):
        if gone is not None and gone.is_set():
            raise APIError(499, "client disconnected")
        rows = order[start : start + CHUNK]
        types = [type_ids[i] for i in rows] if type_ids is not None else None
        for row, vector in zip(rows, encoder.run([token_ids[i] for i in rows], types)):
            outputs[row] = vector
    return np.stack(outputs).astype(np.float32)  # type: ignore[arg-type]


@router.post("/v1/embeddings", response_model=responses.EmbeddingList)
async def create_embeddings(body: EmbeddingRequest, request: Request):
    state: ServerState = request.app.state.ortinf
    ignored = field_policy.apply("/v1/embeddings", body)
    model = state.registry.get(body.model)
    encoder = model.require_embeddings()
    if body.dimensions is not None and body.dimensions > encoder.spec.embedding_dim:
        raise APIError(400, f"dimensions ({body.dimensions}) is more than this model's {encoder.spec.embedding_dim}: ask for "
                            f"at most {encoder.spec.embedding_dim}", param="dimensions")
    ticket = state.admission.acquire(1)
    gone = threading.Event()
    try:
        token_ids = await asyncio.to_thread(token_lists, body, encoder)
        vectors = await until_disconnected(request, asyncio.to_thread(embed_in_chunks, encoder, token_ids, gone))
    finally:
        gone.set()  # a thread still embedding for a client that went away stops at its next chunk
        ticket.release()
    if body.dimensions is not None and body.dimensions < vectors.shape[1]:
        vectors = shortened(vectors, body.dimensions, encoder.spec.normalize)
    data = []
    for index, vector in enumerate(vectors):
        embedding = base64.b64encode(vector.tobytes()).decode() if body.encoding_format == "base64" else vector.tolist()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    num_tokens = sum(len(ids) for ids in token_ids)
    return JSONResponse(responses.body(responses.EmbeddingList.model_validate(
        {"object": "list", "data": data, "model": model.name, "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})),
        headers=field_policy.ignored_headers(ignored))


def shortened(vectors: np.ndarray, dimensions: int, normalize: bool) -> np.ndarray:
    """OpenAI's `dimensions`: the first k dimensions (Matryoshka), unit length again when the model's
    vectors are (cosine similarity of the short vectors is then their dot product, as of the long)."""
    short = np.ascontiguousarray(vectors[:, :dimensions])
    if normalize:
        norms = np.linalg.norm(short, axis=1, keepdims=True)
        short = short / np.maximum(norms, 1e-12)
    return short.astype(np.float32)
