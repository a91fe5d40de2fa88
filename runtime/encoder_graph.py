"""EncoderGraph: an exported encoder package (embeddings or classification) under ONNX Runtime."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ortinf.errors import ConfigError, RequestError
from ortinf.manifest import MODEL_NAME, TEXT_GENERATION, EncoderSpec, Manifest
from ortinf.providers.registry import resolve
from ortinf.providers.session import create_session
from ortinf.runtime.tokenizer import load_tokenizer, pad_token_id


class EncoderGraph:
    """Tokenises texts, pads them into a batch and runs the encoder graph."""

    def __init__(self, package_dir: str | Path, provider: str = "auto", intra_op_threads: int = 0) -> None:
        folder = Path(package_dir)
        self.manifest = Manifest.load(folder)
        if self.manifest.task == TEXT_GENERATION or self.manifest.encoder is None:
            raise ConfigError(f"{package_dir} holds a {self.manifest.task} model, not an encoder")
        self.spec: EncoderSpec = self.manifest.encoder
        self.provider = resolve(provider)
        self.session = create_session(folder / MODEL_NAME, self.provider, intra_op_threads)
        self.tokenizer = load_tokenizer(folder)
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.spec.max_model_len)
        self.pad_id = pad_token_id(folder, self.tokenizer)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, with the model's special tokens, truncated to max_model_len."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def run(self, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """The graph's output for a batch of token-id lists: [batch, dim] embeddings or logits."""
        if not token_ids or any(len(ids) == 0 for ids in token_ids):
            raise RequestError("every input must hold at least one token")
        longest = max(len(ids) for ids in token_ids)
        if longest > self.spec.max_model_len:
            raise RequestError(f"an input has {longest} tokens; this model takes at most {self.spec.max_model_len}")
        ids = np.full((len(token_ids), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, seq in enumerate(token_ids):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        tensors = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return self.session.run(None, {name: tensors[name] for name in self.spec.input_names})[0]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings [len(texts), dim] (pooled, and normalised where the model says so)."""
        return self.run(self.encode(texts))
