"""Idefics3's and SmolVLM's images: tiles of the tower's size and the whole image (ortinf/runtime/worker/images.py
`idefics_tiles`), written into the prompt as text and image tokens (ortinf/exporter/vision/idefics3.py), the tiles
of several images in one call."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortinf.errors import RequestError
from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import PlacedImage
from ortinf.runtime.worker.images import idefics_tiles
from ortinf.runtime.worker.vision_families.family import VISION_BATCH, ImageFamily, Run, concatenated


def preprocess(image, vision: VisionSpec) -> tuple[np.ndarray, int, tuple[int, int]]:  # noqa: ANN001 - a PIL image
    """(tiles, their tokens, (rows, cols) of tiles: the prompt's layout around them)."""
    tiles, rows, cols = idefics_tiles(image, vision.processor)
    return tiles, len(tiles) * vision.tokens_per_image, (rows, cols)


def layout(vision: VisionSpec, count: int, grid: tuple[int, int]) -> tuple[list[int], list[int]]:
    return prompt_tokens(grid[0], grid[1], vision.image_token_id, vision.processor["expansion"])


def prompt_tokens(rows: int, cols: int, image_token: int, expansion: dict) -> tuple[list[int], list[int]]:
    """Idefics3's prompt tokens for an image of rows x cols tiles (0 x 0: unsplit), from the export's tokenization of
    each layout (ortinf/exporter/vision/idefics3.py), each tile's image token written `tokens_per_tile` times; and the
    offsets of the image tokens (where the tiles' embeddings go, in order)."""
    layout = expansion["layouts"].get(f"{rows},{cols}")
    if layout is None:
        raise RequestError(f"the image makes {rows}x{cols} tiles, more than this package's processor makes", param="image")
    seq = expansion["tokens_per_tile"]
    out = [t for token in layout for t in ([image_token] * seq if token == image_token else [token])]
    return out, [i for i, t in enumerate(out) if t == image_token]


def encode(run: Run, images: Sequence[PlacedImage], vision: VisionSpec) -> list[np.ndarray]:
    (tiles,), bounds = concatenated(run, images)
    return [tiles[a:b].reshape(-1, tiles.shape[-1]) for a, b in bounds]


FAMILY = ImageFamily("idefics3", "Idefics3", preprocess, encode, call_limit=2 * VISION_BATCH, layout=layout,
                     tokens_among_text=True)

__all__ = ["FAMILY", "prompt_tokens"]
