"""Encoder tasks: embeddings, pair scores (rerank, score) and classification, over an encoder package's
PoolingEngine (ortinf/runtime/engine/pooling_engine.py) through the one driver (ortinf/tasks/driver.py).

Each input is one engine request, so the inputs of every caller in flight share the engine's steps (batched
across HTTP requests under max_num_seqs and max_num_batched_tokens); a caller's inputs go in sorted by length,
so that its rows batch with rows of similar length (less padding). What is computed from the rows (Matryoshka
shortening, a cross-encoder's sigmoid, cosine similarity, softmax) lives here too, for LLM and the routes alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ortinf.errors import RequestError
from ortinf.tasks import driver
from ortinf.tasks.programs import Samples

if TYPE_CHECKING:
    from ortinf.runtime.engine.async_engine import AsyncEngine
    from ortinf.runtime.engine.pooling_engine import PoolingEngine


class Pooling:
    """An encoder package's tasks. Tokenising and checking (`*_inputs`) are pure: call them off the event loop."""

    def __init__(self, engine: PoolingEngine) -> None:
        self.engine = engine
        self.encoder = engine.encoder
        self.spec = engine.encoder.spec

    # inputs

    def embedding_inputs(self, items: Sequence[str | Sequence[int]], limit: int | None = None) -> list[list[int]]:
        """Token ids of each input (a text, or token ids as given), cut to `limit` tokens (truncate_prompt_tokens),
        checked: an empty text, a limit past the context or an id off the vocabulary is a RequestError."""
        if any(isinstance(item, str) and not item for item in items):
            raise RequestError("input strings must not be empty", param="input")
        if limit is not None and limit > self.spec.max_model_len:
            raise RequestError(f"truncate_prompt_tokens ({limit}) is beyond this model's context length {self.spec.max_model_len}",
                               param="truncate_prompt_tokens")
        texts = [item for item in items if isinstance(item, str)]
        encoded = iter(self.encoder.encode(texts, limit) if texts else [])
        token_ids = [next(encoded) if isinstance(item, str) else list(item)[:limit] for item in items]
        if not token_ids:
            raise RequestError("input must hold at least one text or token list", param="input")
        return token_ids  # each checked (length, vocabulary) as it becomes a request: PoolingEngine.prepare

    def texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of texts, cut to the context (sentence-transformers' truncation)."""
        return self.encoder.encode(texts, self.spec.max_model_len)

    # running

    def _program(self, token_ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None) -> tuple[Samples, list[int]]:
        order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))
        prepared = [self.engine.prepare(token_ids[i], type_ids[i] if type_ids is not None else None) for i in order]
        return Samples(prepared), order

    @staticmethod
    def _rows(program: Samples, order: list[int]) -> np.ndarray:
        rows: list[np.ndarray | None] = [None] * len(order)
        for position, index in enumerate(order):
            rows[index] = program.finals[position].pooled
        return np.stack(rows).astype(np.float32)  # type: ignore[arg-type]

    def run(self, token_ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """The graph's rows for the inputs, in input order, on this thread (LLM's): [inputs, dim]."""
        program, order = self._program(token_ids, type_ids)
        driver.run(self.engine, [program])
        return self._rows(program, order)

    async def run_async(self, engine: AsyncEngine, token_ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None = None,
                        request_id: str = "pool") -> np.ndarray:
        """The same on the server's engine thread, batched with every other caller's inputs; cancelling it (a client
        that went away) aborts the inputs still waiting."""
        program, order = await asyncio.to_thread(self._program, token_ids, type_ids)  # the checks read every token
        await driver.finish(engine, program, request_id)
        return self._rows(program, order)

    # what the rows mean

    def pair_inputs(self, pairs: Sequence[tuple[str, str]]) -> tuple[list[list[int]], list[list[int]] | None, list[str] | None]:
        """What scoring pairs runs: a cross-encoder's joined pairs (ids, type ids, None), or an embedding model's
        distinct texts (ids, None, the texts), each embedded once."""
        if self.spec.labels:
            ids, types = self.encoder.encode_pairs(pairs)
            return ids, types, None
        texts = list(dict.fromkeys(text for pair in pairs for text in pair))
        return self.texts(texts), None, texts

    @staticmethod
    def pair_scores(rows: np.ndarray, pairs: Sequence[tuple[str, str]], texts: list[str] | None) -> np.ndarray:
        """A score per pair: a cross-encoder's sigmoid of its logit, or the cosine similarity of the two texts' embeddings."""
        if texts is None:
            return 1.0 / (1.0 + np.exp(-rows[:, 0].astype(np.float64)))
        vectors = rows.astype(np.float64)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        row = {text: i for i, text in enumerate(texts)}
        return np.array([vectors[row[a]] @ vectors[row[b]] for a, b in pairs])

    @staticmethod
    def probabilities(logits: np.ndarray) -> np.ndarray:
        """A classifier's class probabilities: the sigmoid with one label (a softmax over one class is always 1), else softmax."""
        logits = logits.astype(np.float64)
        if logits.shape[1] == 1:
            return 1.0 / (1.0 + np.exp(-logits))
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return shifted / shifted.sum(axis=1, keepdims=True)

    @staticmethod
    def shortened(vectors: np.ndarray, dimensions: int, normalize: bool) -> np.ndarray:
        """OpenAI's `dimensions`: the first k dimensions (Matryoshka), unit length again when the model's vectors are
        (cosine similarity of the short vectors is then their dot product, as of the long)."""
        short = np.ascontiguousarray(vectors[:, :dimensions])
        if normalize:
            norms = np.linalg.norm(short, axis=1, keepdims=True)
            short = short / np.maximum(norms, 1e-12)
        return short.astype(np.float32)


__all__ = ["Pooling"]
