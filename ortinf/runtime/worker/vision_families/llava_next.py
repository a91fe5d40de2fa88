"""LLaVA-NeXT's images: the whole image and its any-resolution tiles (`anyres_tiles`, each CLIP-normalised), the
tiles of several images in one call, each image's tokens packed as LLaVA-NeXT's pack_image_features packs them
(unpadded to its aspect, a newline embedding after each row)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import PlacedImage
from ortinf.runtime.worker.images import clip_pixels
from ortinf.runtime.worker.vision_families.family import VISION_BATCH, ImageFamily, Run, concatenated


def preprocess(image, vision: VisionSpec) -> tuple[np.ndarray, int, tuple[int, int]]:  # a PIL image
    """(the whole image and its tiles, its tokens, its (height, width): the unpadding's)."""
    return anyres_tiles(image, vision.processor)


def select_best_resolution(height: int, width: int, pinpoints) -> tuple[int, int]:  # [[h, w], ...]
    """transformers' select_best_resolution: the (h, w) keeping the most of the image, then wasting the least."""
    best, most, least = None, 0, float("inf")
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - effective
        if effective > most or (effective == most and wasted < least):
            best, most, least = (int(h), int(w)), effective, wasted
    return best


def anyres_layout(height: int, width: int, processor: dict) -> tuple[int, int, slice, slice]:
    """LLaVA-NeXT's feature grid for an image of height x width: (tile rows, tile columns, the rows and columns of the
    tiles' token grid kept after unpadding), as pack_image_features and the processor's token count compute them."""
    best_h, best_w = select_best_resolution(height, width, processor["grid_pinpoints"])
    tile, side = processor["crop_height"], processor["tokens_per_side"]
    rows, cols = best_h // tile, best_w // tile
    current_h, current_w = rows * side, cols * side
    if width / height > current_w / current_h:
        padding = (current_h - int(round(height * (current_w / width), 7))) // 2
        return rows, cols, slice(padding, current_h - padding), slice(0, current_w)
    padding = (current_w - int(round(width * (current_h / height), 7))) // 2
    return rows, cols, slice(0, current_h), slice(padding, current_w - padding)


def anyres_tiles(image, processor: dict) -> tuple[np.ndarray, int, tuple[int, int]]:  # a PIL image
    """([1 + tiles, 3, S, S] float32, the image's tokens, its (height, width)) as LlavaNextImageProcessor computes them:
    the whole image resized to S x S, then the image resized into the best grid resolution (aspect kept, centred on
    black) cut into S x S tiles row by row; each CLIP-normalised."""
    from PIL import Image

    if processor.get("do_convert_rgb", True) and image.mode != "RGB":
        image = image.convert("RGB")
    width, height = image.size
    resample, tile = Image.Resampling(processor.get("resample", 3)), processor["crop_height"]
    best_h, best_w = select_best_resolution(height, width, processor["grid_pinpoints"])
    scale_w, scale_h = best_w / width, best_h / height
    if scale_w < scale_h:
        new_w, new_h = best_w, min(math.ceil(height * scale_w), best_h)
    else:
        new_h, new_w = best_h, min(math.ceil(width * scale_h), best_w)
    canvas = np.zeros((best_h, best_w, 3), np.uint8)
    top, left = (best_h - new_h) // 2, (best_w - new_w) // 2
    canvas[top : top + new_h, left : left + new_w] = np.asarray(image.resize((new_w, new_h), resample=resample))
    base = processor["resize_shortest_edge"]
    frames = [np.asarray(image.resize((base, base), resample=resample))]
    frames += [canvas[r : r + tile, c : c + tile] for r in range(0, best_h, tile) for c in range(0, best_w, tile)]
    pixels = np.stack([clip_pixels(Image.fromarray(f), processor) for f in frames])
    rows, cols, keep_rows, keep_cols = anyres_layout(height, width, processor)
    kept = (keep_rows.stop - keep_rows.start) * (keep_cols.stop - keep_cols.start + 1)  # each kept row ends in a newline
    return pixels, processor["tokens_per_side"] ** 2 + kept, (height, width)


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

__all__ = ["FAMILY", "anyres_layout", "anyres_tiles", "pack_anyres", "select_best_resolution"]
