"""LLaVA 1.5 (issue 33): a CLIP tower at a fixed size, its feature layer and selection, an MLP projector; each image
its `image_seq_length` tokens."""

from __future__ import annotations

from pathlib import Path

import torch

from ortinf.exporter.vision.family import VisionFamily, VisionGraph, image_processor, trace_images
from ortinf.manifest import VisionSpec


def trace(model: torch.nn.Module, path: Path) -> None:
    trace_images(VisionGraph(model), model.config.vision_config.image_size, path)


def spec(model: torch.nn.Module, source: Path) -> VisionSpec:
    config = model.config
    return VisionSpec(image_token_id=int(config.image_token_index), tokens_per_image=int(config.image_seq_length),
                      image_size=int(config.vision_config.image_size), processor=image_processor(source, model))


FAMILY = VisionFamily(
    "LLaVA", {"llava": "LlavaForConditionalGeneration"},
    {"llava": "LLaVA 1.5 (llava-hf/llava-1.5-*): CLIP vision tower, MLP projector, Llama language model"},
    trace, spec,
)

__all__ = ["FAMILY"]
