"""POST /v1/rerank (and /v2/rerank, /rerank: Jina's and Cohere's body), /score (vLLM's) and /classify
(vLLM's), over encoder packages.

A score of a (query, document) pair comes from one of two kinds of package:
- a cross-encoder (a text-classification package with one label: the pair through the tokenizer's pair
  template, one logit, sigmoid; sentence-transformers' CrossEncoder does the same);
- an embedding model (feature-extraction): the cosine similarity of the two texts' embeddings.
/classify takes any text-classification package: each text's label and class probabilities (softmax; a
sigmoid for a single label).

The math is ortinf/tasks/pooling.py's; each input is a request of the model's PoolingEngine, batched with every
other request's, with the embeddings' admission, limits and client-disconnect handling.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ortinf.manifest import FEATURE_EXTRACTION, TEXT_CLASSIFICATION
from ortinf.serve.errors import APIError
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import MAX_EMBEDDING_INPUTS
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import until_disconnected
from ortinf.tasks.kinds import PoolingTask
from ortinf.tasks.pooling import Pooling

router = APIRouter()
STRICT = ConfigDict(extra="forbid")
Text = Annotated[str, Field(min_length=1)]
Texts = Annotated[list[Text], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]


class Document(BaseModel):
    model_config = ConfigDict(extra="allow")  # Cohere's documents may carry fields of their own

    text: Text


class RerankRequest(BaseModel):
    """Jina's and Cohere's rerank body (vLLM's too)."""

    model_config = STRICT

    model: str | None = None
    query: Text
    documents: Annotated[list[Text | Document], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    top_n: Annotated[int, Field(strict=True, ge=1)] | None = None
    return_documents: bool = True
    max_chunks_per_doc: int | None = Field(None, description="Cohere's; accepted, documents are cut to the context instead")


class ScoreRequest(BaseModel):
    """vLLM's /score: text_1 against each of text_2 (one text_1), or pair by pair (equal lists)."""

    model_config = STRICT

    model: str | None = None
    text_1: Text | Texts
    text_2: Text | Texts


class ClassifyRequest(BaseModel):
    """vLLM's /classify."""

    model_config = STRICT

    model: str | None = None
    input: Text | Texts


def _scorer(model: ServedModel) -> Pooling:
    task = model.manifest.task
    if not isinstance(model.task, PoolingTask) or task not in (FEATURE_EXTRACTION, TEXT_CLASSIFICATION):
        raise APIError(400, f"model '{model.name}' is a {task} model: scoring needs a cross-encoder (text-classification with one "
                            "label) or an embedding model", param="model")
    pooling = model.task.pooling
    if task == TEXT_CLASSIFICATION and len(pooling.spec.labels) != 1:
        raise APIError(400, f"model '{model.name}' classifies into {len(pooling.spec.labels)} labels: scoring needs a "
                            "cross-encoder with one (a relevance logit); use /classify", param="model")
    return pooling


async def _pooled(request: Request, model: ServedModel, ids: list[list[int]], types: list[list[int]] | None = None):
    """The encoder's rows for `ids`, batched by the model's engine with every other request's, under one admission
    ticket; a client that goes away aborts its inputs still waiting."""
    state: ServerState = request.app.state.ortinf
    ticket = state.admission.acquire(1)
    try:
        return await until_disconnected(request, model.task.pooling.run_async(model.engine, ids, types, f"score-{uuid.uuid4().hex}"))
    finally:
        ticket.release()


async def pair_scores(request: Request, model: ServedModel, pairs: list[tuple[str, str]]) -> tuple[np.ndarray, int]:
    """(a score per pair, tokens read): a cross-encoder's sigmoid, or an embedding model's cosine similarity."""
    pooling = _scorer(model)
    ids, types, texts = await asyncio.to_thread(pooling.pair_inputs, pairs)
    rows = await _pooled(request, model, ids, types)
    return pooling.pair_scores(rows, pairs, texts), sum(len(row) for row in ids)


def _usage(tokens: int) -> dict:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


@router.post("/v1/rerank")
@router.post("/v2/rerank")
@router.post("/rerank")
async def rerank(body: RerankRequest, request: Request):
    model = await request.app.state.ortinf.model(body.model, request)
    documents = [d if isinstance(d, str) else d.text for d in body.documents]
    scores, tokens = await pair_scores(request, model, [(body.query, d) for d in documents])
    order = sorted(range(len(documents)), key=lambda i: -scores[i])[: body.top_n or len(documents)]
    results = [{"index": i, "relevance_score": float(scores[i]), **({"document": {"text": documents[i]}} if body.return_documents else {})}
               for i in order]
    return JSONResponse({"id": f"rerank-{uuid.uuid4().hex}", "model": model.name, "results": results, "usage": {"total_tokens": tokens},
                         "meta": {"billed_units": {"search_units": 1}}})


@router.post("/score")
@router.post("/v1/score")
async def score(body: ScoreRequest, request: Request):
    model = await request.app.state.ortinf.model(body.model, request)
    _scorer(model)
    first = [body.text_1] if isinstance(body.text_1, str) else body.text_1
    second = [body.text_2] if isinstance(body.text_2, str) else body.text_2
    if len(first) == 1:
        pairs = [(first[0], text) for text in second]
    elif len(first) == len(second):
        pairs = list(zip(first, second))
    else:
        raise APIError(400, f"text_1 has {len(first)} texts and text_2 {len(second)}: send one text_1, or as many as text_2",
                       param="text_1")
    scores, tokens = await pair_scores(request, model, pairs)
    data = [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)]
    return JSONResponse({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model.name,
                         "data": data, "usage": _usage(tokens)})


@router.post("/classify")
@router.post("/v1/classify")
async def classify(body: ClassifyRequest, request: Request):
    model = await request.app.state.ortinf.model(body.model, request)
    if not isinstance(model.task, PoolingTask) or model.manifest.task != TEXT_CLASSIFICATION:
        raise APIError(400, f"model '{model.name}' is a {model.manifest.task} model: /classify needs a text-classification "
                            "package", param="model")
    pooling = model.task.pooling
    texts = [body.input] if isinstance(body.input, str) else body.input
    ids = await asyncio.to_thread(pooling.texts, texts)
    probs, tokens = pooling.probabilities(await _pooled(request, model, ids)), sum(len(row) for row in ids)
    labels = pooling.spec.labels
    data = [{"index": i, "label": labels[int(np.argmax(p))], "probs": [float(x) for x in p], "num_classes": len(labels)}
            for i, p in enumerate(probs)]
    return JSONResponse({"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model.name,
                         "data": data, "usage": _usage(tokens)})
