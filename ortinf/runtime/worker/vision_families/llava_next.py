"""LLaVA-NeXT's images: the whole image and its any-resolution tiles (ortinf/runtime/worker/images.py
`anyres_tiles`), the tiles of several images in one call, each image's tokens packed as LLaVA-NeXT's
pack_image_features packs them (unpadded to its aspect, a newline embedding after each row)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import PlacedImage
from ortinf.runtime.worker.images import anyres_layout, anyres_tiles
from ortinf.runtime.worker.vision_families.family import VISION_BATCH, ImageFamily, Run, concatenated


def preprocess(image, vision: VisionSpec) -> tuple[np.ndarray, int, tuple[int, int]]:  # noqa: ANN001 - a PIL image
    """(the whole image and its tiles, its tokens, its (height, width): the unpadding's)."""
    return anyres_tiles(image, vision.processor)


def encode(run: Run, images: Sequence[PlacedImage], vision: VisionSpec) -> list[np.ndarray]:
    (tiles, newline), bounds = concatenated(run, images)
    return [pack_anyres(tiles[a:b], newline, p.grid, vision.processor) for (a, b), p in zip(bounds, images)]


def pack_anyres(tiles: np.ndarray, newline: np.ndarray, size: tuple[int, int], processor: dict) -> np.ndarray:
    """LLaVA-NeXT's pack_image_features for one image: the whole image's tokens, then the tiles' tokens as one grid
    (tile rows x tile columns of side x side), unpadded to the image's aspect, each row followed by the newline
    embedding."""
    rows, cols, keep_rows, keep_cols = anyres_layout(size[0], size[1], processor)
    side = processor["tokens_per_side"]
    grid = tiles[1:].reshape(rows, cols, side, side, -1).transpose(0, 2, 1, 3, 4).reshape(rows * side, cols * side, -1)
    grid = grid[keep_rows, keep_cols]
    grid = np.concatenate([grid, np.broadcast_to(newline, (grid.shape[0], 1, grid.shape[2]))], axis=1)
    return np.concatenate([tiles[0], grid.reshape(-1, grid.shape[2])])


FAMILY = ImageFamily("llava_next", "LLaVA-NeXT", preprocess, encode, call_limit=2 * VISION_BATCH, keeps_grid=True)

__all__ = ["FAMILY", "pack_anyres"]
