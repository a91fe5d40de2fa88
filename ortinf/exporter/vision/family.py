"""VisionFamily: a vision-language family's export side, one record per family (one file each in this folder, one line
in its registry, __init__.py). The frame every family shares (the text decoder's export, the image merge, the
tower's quantization and the check against transformers) is ortinf/exporter/vision_language.py; it reads the record
instead of branching on the family's name. What a package's images need at serving is the VisionSpec the record
writes, and the runtime's record of the family the spec names (ortinf/runtime/worker/vision_families/).

Here too: LLaVA's vision graph (LLaVA-NeXT's with its newline embedding), the trace of a tower that takes images
of the tower's size, CLIP's processor settings, and the defaults a family keeps unless its record says otherwise.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ortinf.exporter.tracing import OPSET
from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage

IMAGE_EMBEDS, IMAGE_ROWS = "image_embeds", "image_rows"
# the check's prompt (token ids), the transformers model's image inputs, the image as the runtime places it
Example = tuple[list[int], dict[str, torch.Tensor], PlacedImage]


def text_config(model: torch.nn.Module):  # a transformers config
    """The language model's config, as the source holds it."""
    return copy.deepcopy(model.config.text_config)


def language_model(model: torch.nn.Module) -> torch.nn.Module:
    return model.model.language_model


def pixel_feeds(model: torch.nn.Module, vision: VisionSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The vision graph's input for two random images of the tower's size."""
    return {"pixel_values": rng.standard_normal((2, 3, vision.image_size, vision.image_size)).astype(np.float32)}


def one_image(model: torch.nn.Module, vision: VisionSpec, rng: np.random.Generator) -> Example:
    """A prompt holding one image of the tower's size, with the package's text around it (Gemma 3's) and its span."""
    size, image_id = vision.image_size, vision.image_token_id
    pixels = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    ids = [5, 7, *vision.image_prefix_ids] + [image_id] * vision.tokens_per_image + [*vision.image_suffix_ids, 9, 11, 13]
    placed = PlacedImage(ids.index(image_id), EncoderInput.of(pixels[0], vision.tokens_per_image, "image"), whole=vision.whole_images)
    return ids, {"pixel_values": torch.from_numpy(pixels)}, placed


@dataclass(frozen=True, slots=True)
class VisionFamily:
    """One family's export: `trace(model, path)` writes vision.onnx (under torch.no_grad and quiet tracing);
    `spec(model, source)` is what the runtime needs to feed it and to write a prompt's images (the processor's
    settings, the prompt layout's tokens, VisionSpec.family: the runtime record that serves the packages)."""

    title: str  # how messages name it
    classes: dict[str, str]  # model_type -> its transformers class (model types that differ only in name share a family)
    examples: dict[str, str]  # model_type -> what `ortinf export --list-architectures` says of it
    trace: Callable[[torch.nn.Module, Path], None]
    spec: Callable[[torch.nn.Module, Path], VisionSpec]
    text_config: Callable[[torch.nn.Module], object] = text_config  # the text decoder's config (AutoModelForCausalLM's)
    language_model: Callable[[torch.nn.Module], torch.nn.Module] = language_model  # its weights, under model.*
    # a prefill's image tokens attend to each other both ways: the decoder takes image spans (portable kernel only)
    image_spans: bool = False
    random_feeds: Callable[[torch.nn.Module, VisionSpec, np.random.Generator], dict[str, np.ndarray]] = pixel_feeds
    # around the whole export: what it expects transformers to log and keeps quiet (Qwen2-VL's M-RoPE config keys)
    quiet: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    example: Callable[[torch.nn.Module, VisionSpec, np.random.Generator], Example] = one_image


class VisionGraph(torch.nn.Module):
    """pixel_values -> each image's embeddings in the language model's space (LLaVA's tower, feature layer and
    selection, projector; with `newline`, LLaVA-NeXT's newline embedding as a second output, which the host writes
    after each row of tiles)."""

    def __init__(self, model: torch.nn.Module, newline: bool = False) -> None:
        super().__init__()
        self.model = model
        self.newline = newline

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        config, inner = self.model.config, self.model.model
        # transformers' get_image_features, without its split into a list (a traced Split keeps the example's count)
        states = inner.vision_tower(pixel_values, output_hidden_states=True).hidden_states
        layers = config.vision_feature_layer if isinstance(config.vision_feature_layer, list) else [config.vision_feature_layer]
        features = torch.cat([states[i] for i in layers], dim=-1)
        if config.vision_feature_select_strategy == "default":
            features = features[:, 1:]
        if self.newline:
            return inner.multi_modal_projector(features), inner.image_newline
        return inner.multi_modal_projector(features)


def trace_images(graph: torch.nn.Module, size: int, path: Path, outputs: tuple[str, ...] = (IMAGE_EMBEDS,),
                 count: str = "num_images") -> None:
    """Traces a tower over pixel_values [count, 3, size, size] (the example: two images) to `path`."""
    torch.onnx.export(graph.eval(), (torch.randn(2, 3, size, size),), str(path), dynamo=False,
                      input_names=["pixel_values"], output_names=list(outputs), opset_version=OPSET,
                      dynamic_axes={"pixel_values": {0: count}, IMAGE_EMBEDS: {0: count}})


def preprocessor_config(source: Path) -> dict:
    """The source's preprocessor_config.json ({} without one)."""
    path = source / "preprocessor_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def image_processor(source: Path, model: torch.nn.Module) -> dict:
    """The source's CLIP image processor settings (preprocessor_config.json), or CLIP's defaults at the tower's size."""
    config = preprocessor_config(source)
    size = model.config.vision_config.image_size
    shortest = (config.get("size") or {}).get("shortest_edge", size)
    crop = config.get("crop_size") or {"height": size, "width": size}
    return {"resize_shortest_edge": int(shortest), "crop_height": int(crop["height"]), "crop_width": int(crop["width"]),
            "do_center_crop": bool(config.get("do_center_crop", True)), "rescale_factor": float(config.get("rescale_factor", 1 / 255)),
            "image_mean": list(config.get("image_mean", [0.48145466, 0.4578275, 0.40821073])),
            "image_std": list(config.get("image_std", [0.26862954, 0.26130258, 0.27577711])),
            "resample": int(config.get("resample", 3)), "do_convert_rgb": bool(config.get("do_convert_rgb", True))}


__all__ = ["IMAGE_EMBEDS", "IMAGE_ROWS", "Example", "VisionFamily", "VisionGraph", "image_processor", "one_image",
           "pixel_feeds", "preprocessor_config", "trace_images"]
