"""LLaVA 1.5's images, and Gemma 3's (its packages name this family: what differs, the plain resize, the text
around the image and its whole-image attention, is in its VisionSpec): one fixed-size image each, CLIP's
preprocessing (ortinf/runtime/worker/images.py `clip_pixels`), stacked up to VISION_BATCH images a call."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import PlacedImage
from ortinf.runtime.worker.images import clip_pixels
from ortinf.runtime.worker.vision_families.family import VISION_BATCH, ImageFamily, Run


def preprocess(image, vision: VisionSpec) -> tuple[np.ndarray, int, None]:  # a PIL image
    return clip_pixels(image, vision.processor), vision.tokens_per_image, None


def encode(run: Run, images: Sequence[PlacedImage], vision: VisionSpec) -> list[np.ndarray]:
    (embeds,) = run({"pixel_values": np.ascontiguousarray(np.stack([p.image.data for p in images]))})
    return list(embeds)


FAMILY = ImageFamily("llava", "LLaVA", preprocess, encode, call_limit=VISION_BATCH, per_image=True)

__all__ = ["FAMILY"]
