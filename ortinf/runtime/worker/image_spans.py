"""Gemma 3's image spans: at prefill an image's tokens attend to every token of the same image, before and after
(transformers' token_type_ids mask), so the decoder graph takes `attend_until` [tokens]: the last position each
token may see (its own outside an image, the image's last inside one). The scheduler keeps an image in one prefill
chunk (ortinf/runtime/core/scheduler.py), so the positions a token must see are among the step's own or cached."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortinf.runtime.worker.encoder_input import PlacedImage


def attend_until(images: Sequence[PlacedImage], start: int, end: int) -> np.ndarray:
    """[end - start] int64: the last position each of positions start .. end - 1 attends to."""
    positions = np.arange(start, end, dtype=np.int64)
    until = positions.copy()
    for placed in images:
        if placed.whole:
            until[(positions >= placed.offset) & (positions < placed.end)] = placed.end - 1
    return until


def whole_image_chunk(images: Sequence[PlacedImage], start: int, num_new: int) -> int:
    """The tokens a prefill chunk from `start` may take, at most `num_new`, without ending inside a whole image:
    cut before such an image, or 0 when the chunk starts in (or at) one it cannot finish."""
    end = start + num_new
    for placed in images:
        if placed.whole and placed.offset < end < placed.end:
            return max(placed.offset - start, 0)
    return num_new


__all__ = ["attend_until", "whole_image_chunk"]
