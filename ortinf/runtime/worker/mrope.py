"""Qwen2-VL's multimodal RoPE positions (M-RoPE), as transformers' get_rope_index computes them, for any span of
a sequence: the decoder graph takes them as `rope_deltas` [3, tokens], offsets from each token's index.

A text token's three components are all its position; an image's token at row r, column c of its rows x cols
grid has (b, b + r, b + c), b the position its first token would have as text; after the image the text goes on
from b + max(rows, cols). So before the first image every delta is 0, inside an image the deltas follow the grid,
and after an image every component's delta moves by max(rows, cols) - rows * cols (generated tokens included).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortinf.runtime.worker.encoder_input import PlacedImage


def rope_deltas(images: Sequence[PlacedImage], start: int, end: int) -> np.ndarray:
    """[3, end - start] int64: component c of index p's rotary position is p + deltas[c, p - start]."""
    index = np.arange(start, end)
    deltas = np.zeros((3, end - start), np.int64)
    shift, text_from = 0, 0
    for placed in sorted(images, key=lambda p: p.offset):
        rows, cols = placed.grid
        deltas[:, (index >= text_from) & (index < placed.offset)] = shift
        inside = (index >= placed.offset) & (index < placed.end)
        within = index[inside] - placed.offset
        base = placed.offset + shift - index[inside]
        deltas[0, inside], deltas[1, inside], deltas[2, inside] = base, base + within // cols, base + within % cols
        shift += max(rows, cols) - rows * cols
        text_from = placed.end
    deltas[:, index >= text_from] = shift
    return deltas


__all__ = ["rope_deltas"]
