"""EncoderInput: what an encoder-decoder request (Marian, BART, a Whisper window) gives its encoder.

The engine treats it as part of the request's prompt: the KV cache manager gives the request cross
blocks for `num_positions` encoder positions (ortinf/runtime/core/kv_cache_manager.py), the model runner runs the
encoder into them the step the request is admitted (ortinf/runtime/worker/cross_encoder.py), and `digest` salts the
request's prefix-cache keys, so that the same input again (a second request, a retry, a request
readmitted after preemption) finds its cross blocks and skips the encoder, while the same decoder
tokens over another input never match (the decoder's K/V depend on the input through cross-attention).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True, eq=False)
class EncoderInput:
    """The encoder's input for one request: source token ids [S] or a log-mel window [mels, frames]."""

    data: np.ndarray
    num_positions: int  # encoder positions its cross K/V fill (a source's length; Whisper: 1500)
    digest: str  # the data's identity in prefix-cache keys

    @classmethod
    def of(cls, data: np.ndarray, num_positions: int, kind: str) -> EncoderInput:
        data = np.ascontiguousarray(data)
        digest = hashlib.blake2b(data.tobytes(), digest_size=16)
        digest.update(str(data.shape).encode())
        return cls(data, num_positions, f"{kind}:{digest.hexdigest()}")


@dataclass(frozen=True, slots=True, eq=False)
class PlacedImage:
    """An image of a vision-language request (ortinf/exporter/vision_language.py): its pixels as an EncoderInput
    (num_positions: the embeddings it becomes) and where in the prompt its placeholder tokens start. The model
    runner turns it into embeddings (cached by digest) for the steps whose chunks cover those positions; its
    digest salts the request's prefix-cache keys, so blocks computed over another image never match."""

    offset: int
    image: EncoderInput
    grid: tuple[int, int] | None = None  # Qwen2-VL: the image's tokens as rows x columns (its M-RoPE positions)
    whole: bool = False  # Gemma 3: its tokens attend to each other both ways, so a prefill chunk may not end inside it
    # Idefics3: the image is written as text and image tokens over `span` positions, its embeddings at these offsets
    # from `offset` (None: every position of the image is one of its embeddings, in order)
    rows: tuple[int, ...] | None = None
    span: int = 0

    @property
    def end(self) -> int:
        return self.offset + (self.span or self.image.num_positions)


__all__ = ["EncoderInput", "PlacedImage"]


def covered(images: Sequence[PlacedImage], start: int, end: int) -> list[PlacedImage]:
    """The images with a position in [start, end) of their sequence (what a chunk of those positions needs)."""
    return [p for p in images if p.offset < end and p.end > start]
