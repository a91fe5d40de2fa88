"""Gemma 3 4B/12B/27B: SigLIP at 896 px, 4x4 average pooling, RMS norm and projection (transformers'
get_image_features, already one tensor), 256 tokens an image written between "\\n\\n<start_of_image>" and
"<end_of_image>\\n\\n"; a prefill's image tokens attend to their whole image (image spans: the decoder's
`attend_until`, ortinf/runtime/worker/image_spans.py). Its packages are served as LLaVA's (VisionSpec.family
"llava": the plain resize, the text around the image and the whole-image attention are in the spec)."""

from __future__ import annotations

from pathlib import Path

import torch

from ortinf.exporter.vision.family import VisionFamily, preprocessor_config, trace_images
from ortinf.manifest import VisionSpec


class ImageFeatures(torch.nn.Module):
    """pixel_values -> transformers' get_image_features."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.model.get_image_features(pixel_values)


def trace(model: torch.nn.Module, path: Path) -> None:
    trace_images(ImageFeatures(model), model.config.vision_config.image_size, path)


def spec(model: torch.nn.Module, source: Path) -> VisionSpec:
    config = model.config
    around = newlines(source)  # the processor writes "\n\n<start_of_image>" + image tokens + "<end_of_image>\n\n"
    return VisionSpec(image_token_id=int(config.image_token_index), tokens_per_image=int(config.mm_tokens_per_image),
                      image_size=int(config.vision_config.image_size), processor=gemma_processor(source, model),
                      placeholder_id=int(config.boi_token_index), image_prefix_ids=(*around, int(config.boi_token_index)),
                      image_suffix_ids=(int(config.eoi_token_index), *around), whole_images=True)


def newlines(source: Path) -> tuple[int, ...]:
    """The ids of "\\n\\n" in the source's tokenizer (none without one)."""
    if not (source / "tokenizer.json").is_file():
        return ()
    from tokenizers import Tokenizer

    return tuple(Tokenizer.from_file(str(source / "tokenizer.json")).encode("\n\n", add_special_tokens=False).ids)


def gemma_processor(source: Path, model: torch.nn.Module) -> dict:
    """Gemma3ImageProcessor's settings: a plain resize to the tower's size (bilinear), rescale, normalise by 0.5."""
    config = preprocessor_config(source)
    size = config.get("size") or {}
    side = model.config.vision_config.image_size
    return {"resize_height": int(size.get("height", side)), "resize_width": int(size.get("width", side)), "do_center_crop": False,
            "rescale_factor": float(config.get("rescale_factor", 1 / 255)), "image_mean": list(config.get("image_mean", [0.5] * 3)),
            "image_std": list(config.get("image_std", [0.5] * 3)), "resample": int(config.get("resample", 2)),
            "do_convert_rgb": bool(config.get("do_convert_rgb", True))}


FAMILY = VisionFamily(
    "Gemma 3", {"gemma3": "Gemma3ForConditionalGeneration"},
    {"gemma3": "Gemma 3 4B/12B/27B (google/gemma-3-*-it): SigLIP at 896 px, 256 tokens an image attending both ways"},
    trace, spec, image_spans=True,
)

__all__ = ["FAMILY", "gemma_processor", "newlines"]
