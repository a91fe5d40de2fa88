"""The vision-language families the exporter writes, one file each in this folder and one line below: its
record (ortinf/exporter/vision/family.py) holds what differs (the transformers classes, the vision tower's trace, the
text model, the processor settings and prompt layout the runtime reads, the check's example image). The runtime
serves a package by the family its VisionSpec names (ortinf/runtime/worker/vision_families/)."""

from __future__ import annotations

from ortinf.exporter.vision import gemma3, idefics3, llava, llava_next, qwen2_vl
from ortinf.exporter.vision.family import VisionFamily

FAMILIES: tuple[VisionFamily, ...] = (
    llava.FAMILY,
    llava_next.FAMILY,
    gemma3.FAMILY,
    idefics3.FAMILY,
    qwen2_vl.FAMILY,
)
BY_MODEL_TYPE: dict[str, VisionFamily] = {model_type: family for family in FAMILIES for model_type in family.classes}

__all__ = ["BY_MODEL_TYPE", "FAMILIES", "VisionFamily"]
