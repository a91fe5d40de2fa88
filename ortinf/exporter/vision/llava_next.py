"""LLaVA-NeXT / LLaVA 1.6: LLaVA's tower over any-resolution tiles (the whole image and the tiles of its best grid
resolution), the tiles' tokens packed with a newline embedding after each row (the host packs them:
ortinf/runtime/worker/vision_families/llava_next.py); an image's token count follows its size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ortinf.exporter.vision.family import IMAGE_EMBEDS, Example, VisionFamily, VisionGraph, image_processor, trace_images
from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage
from ortinf.runtime.worker.vision_families.llava_next import anyres_layout


def trace(model: torch.nn.Module, path: Path) -> None:
    trace_images(VisionGraph(model, newline=True), model.config.vision_config.image_size, path, (IMAGE_EMBEDS, "image_newline"))


def spec(model: torch.nn.Module, source: Path) -> VisionSpec:
    """A tile's tokens; an image's own count follows its size (anyres_tiles)."""
    config = model.config
    size = config.vision_config.image_size
    side = size // config.vision_config.patch_size
    pinpoints = [list(p) for p in config.image_grid_pinpoints]
    return VisionSpec(image_token_id=int(config.image_token_index), tokens_per_image=side * side, image_size=int(size),
                      processor={**image_processor(source, model), "grid_pinpoints": pinpoints, "tokens_per_side": side},
                      family="llava_next")


def example(model: torch.nn.Module, vision: VisionSpec, rng: np.random.Generator) -> Example:
    """An image twice as high as wide: its whole and its tiles, packed with newlines."""
    size = vision.image_size
    rows, cols, keep_rows, keep_cols = anyres_layout(2 * size, size, vision.processor)
    pixels = rng.standard_normal((1 + rows * cols, 3, size, size)).astype(np.float32)
    inputs = {"pixel_values": torch.from_numpy(pixels[None]), "image_sizes": torch.tensor([[2 * size, size]])}
    count = vision.tokens_per_image + (keep_rows.stop - keep_rows.start) * (keep_cols.stop - keep_cols.start + 1)
    ids = [5, 7] + [vision.image_token_id] * count + [9, 11, 13]
    return ids, inputs, PlacedImage(2, EncoderInput.of(pixels, count, "image"), (2 * size, size))


FAMILY = VisionFamily(
    "LLaVA-NeXT", {"llava_next": "LlavaNextForConditionalGeneration"},
    {"llava_next": "LLaVA-NeXT / LLaVA 1.6 (llava-hf/llava-v1.6-*): any-resolution tiles with a newline per row"},
    trace, spec, example=example,
)

__all__ = ["FAMILY"]
