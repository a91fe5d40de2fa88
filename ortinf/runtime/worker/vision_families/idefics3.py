"""Idefics3's and SmolVLM's images: tiles of the tower's size and the whole image (`idefics_tiles`), written into
the prompt as text and image tokens (ortinf/exporter/vision/idefics3.py), the tiles of several images in one
call."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ortinf.errors import RequestError
from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import PlacedImage
from ortinf.runtime.worker.images import normalized
from ortinf.runtime.worker.vision_families.family import VISION_BATCH, ImageFamily, Run, concatenated


def preprocess(image, vision: VisionSpec) -> tuple[np.ndarray, int, tuple[int, int]]:  # a PIL image
    """(tiles, their tokens, (rows, cols) of tiles: the prompt's layout around them)."""
    tiles, rows, cols = idefics_tiles(image, vision.processor)
    return tiles, len(tiles) * vision.tokens_per_image, (rows, cols)


def idefics_tiles(image, processor: dict) -> tuple[np.ndarray, int, int]:  # a PIL image
    """([tiles, 3, S, S] float32, rows, cols) as Idefics3ImageProcessor computes them: the longest edge resized to
    `longest_edge`, then both sides up to multiples of the tile size S, cut into rows x cols tiles (row by row) and
    followed by the whole image at S x S; an image that fits one tile is that tile alone (rows = cols = 0).
    Non-RGB images are converted to RGB first (transformers converts after resizing)."""
    from PIL import Image

    if image.mode != "RGB":
        image = image.convert("RGB")
    resample, tile = Image.Resampling(processor.get("resample", 1)), processor["tile"]
    width, height = image.size
    longest = processor["longest_edge"]
    if width >= height:  # _resize_output_size_rescale_to_max_len, then below transformers' MAX_IMAGE_SIZE (4096)
        width, height = longest, int(longest / (width / height))
        height += height % 2
    else:
        height, width = longest, int(longest * (width / height))
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    if max(width, height) > 4096:
        ratio = width / height
        width, height = (4096, max(int(4096 / ratio), 1)) if width >= height else (max(int(4096 * ratio), 1), 4096)
    image = image.resize((width, height), resample=resample)
    rows = cols = 0
    if processor.get("do_image_splitting", True):  # resize_for_vision_encoder and split_image
        ratio = width / height
        if width >= height:
            width = math.ceil(width / tile) * tile
            height = math.ceil(int(width / ratio) / tile) * tile
        else:
            height = math.ceil(height / tile) * tile
            width = math.ceil(int(height * ratio) / tile) * tile
        image = image.resize((width, height), resample=resample)
        frames = []
        if height > tile or width > tile:
            rows, cols = math.ceil(height / tile), math.ceil(width / tile)
            pixels = np.asarray(image)
            step_h, step_w = math.ceil(height / rows), math.ceil(width / cols)
            frames = [pixels[r * step_h : min((r + 1) * step_h, height), c * step_w : min((c + 1) * step_w, width)]
                      for r in range(rows) for c in range(cols)]
            if (height, width) != (tile, tile):
                image = image.resize((tile, tile), resample=resample)
        frames.append(np.asarray(image))
    else:
        frames = [np.asarray(image.resize((tile, tile), resample=resample))]
    return np.ascontiguousarray(np.stack([normalized(f, processor).transpose(2, 0, 1) for f in frames])), rows, cols


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

__all__ = ["FAMILY", "idefics_tiles", "prompt_tokens"]
