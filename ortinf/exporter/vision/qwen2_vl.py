"""Qwen2-VL and Qwen2.5-VL (issue 33): the family's export record and the parts that differ from LLaVA's
(ortinf/exporter/vision/llava.py; the frame: ortinf/exporter/vision_language.py; the design: docs/runtime.md, Images).

transformers' vision forward builds the patches' 2-D rotary positions, Qwen2.5-VL's window order and the attention's
splits in Python loops over `grid_thw`, which a trace would freeze at the example's grid; the traced graph takes
them as inputs, computed on the host (ortinf/runtime/worker/vision_families/qwen2_vl.py `qwen_vision_feeds`):

    pixel_values  [N, C * T * P * P]  the processor's patches, in window order
    patch_positions [N, 2]            each patch's (row, column) in its image, for the 2-D rotary embedding
    image_ids     [N]                 which image a patch belongs to (full-attention layers attend within it)
    window_index  [W, L]              Qwen2.5-VL's windows: each window's patches (contiguous in window order),
    window_mask   [W, L]              padded to the largest window L, 1 where real
    patch_slot    [N]                 each patch's place in the flattened [W * L] windows
    -> image_embeds [N / merge**2, hidden], in window order (the host puts them back in raster order)

Full-attention layers attend within an image as a masked softmax over the call's N patches (N**2: the host batches
images only while small); windowed layers attend within each gathered window ([W, L, L]). Both give transformers'
per-segment attention's values. The language model is Qwen2's with M-RoPE: its text config keeps `mrope_section`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ortinf.exporter.tracing import OPSET
from ortinf.exporter.vision.family import IMAGE_EMBEDS, Example, VisionFamily
from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage
from ortinf.runtime.worker.vision_families.qwen2_vl import qwen_vision_feeds

VISION_INPUTS = ("pixel_values", "patch_positions", "image_ids", "window_index", "window_mask", "patch_slot")


class QwenVisionGraph(torch.nn.Module):
    """The vision tower and merger over host-computed positions and segments (see the module docstring)."""

    def __init__(self, visual: torch.nn.Module) -> None:
        super().__init__()
        self.visual = visual
        full = getattr(visual, "fullatt_block_indexes", None)  # Qwen2.5-VL's; Qwen2-VL attends over the whole image everywhere
        self.full_layers = set(range(len(visual.blocks)) if full is None else full)

    def forward(self, pixel_values: torch.Tensor, patch_positions: torch.Tensor, image_ids: torch.Tensor, window_index: torch.Tensor,
                window_mask: torch.Tensor, patch_slot: torch.Tensor) -> torch.Tensor:
        visual = self.visual
        hidden = visual.patch_embed(pixel_values)
        inv_freq = visual.rotary_pos_emb.inv_freq
        # transformers: outer(arange(max grid), inv_freq)[positions]: the same fp32 products
        freqs = (patch_positions.float()[:, :, None] * inv_freq[None, None, :].float()).flatten(1)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        full = segment_mask(image_ids)
        windows = Windows(window_index, torch.where(window_mask.bool(), torch.tensor(0.0), torch.tensor(torch.finfo(torch.float32).min)),
                          patch_slot)
        for index, block in enumerate(visual.blocks):
            attention = segment_attention(block.attn, block.norm1(hidden), cos, sin, full if index in self.full_layers else windows)
            hidden = hidden + attention
            hidden = hidden + block.mlp(block.norm2(hidden))
        return visual.merger(hidden)


class Windows:
    """Qwen2.5-VL's windows as gather indices: [W, L] patches, an additive key mask [W, L], each patch's flat slot [N]."""

    def __init__(self, index: torch.Tensor, mask: torch.Tensor, slot: torch.Tensor) -> None:
        self.index, self.mask, self.slot = index, mask, slot


def segment_mask(segments: torch.Tensor) -> torch.Tensor:
    """[1, N, N] additive mask: 0 within a segment, the dtype's minimum across segments."""
    same = segments[:, None] == segments[None, :]
    return torch.where(same, torch.tensor(0.0), torch.tensor(torch.finfo(torch.float32).min))[None]


def segment_attention(attn: torch.nn.Module, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      mask: torch.Tensor | Windows) -> torch.Tensor:
    """The vision attention's forward (qkv, 2-D RoPE, softmax attention, proj) over its splits: a [1, N, N] mask, or
    windows gathered and attended one by one in a batch."""
    module = sys.modules[type(attn).__module__]
    length = hidden.shape[0]
    query, key, value = attn.qkv(hidden).reshape(length, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    query, key = module.apply_rotary_pos_emb_vision(query, key, cos, sin)
    if isinstance(mask, Windows):  # [W, L, heads, d] -> [W, heads, L, d]
        query, key, value = (t[mask.index].permute(0, 2, 1, 3) for t in (query, key, value))
        scores = torch.matmul(query, key.transpose(2, 3)) * attn.scaling + mask.mask[:, None, None, :]
        out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype), value)  # [W, heads, L, d]
        out = out.permute(0, 2, 1, 3).reshape(-1, attn.num_heads * out.shape[-1])[mask.slot]  # [N, heads * d]
        return attn.proj(out)
    query, key, value = (t.transpose(0, 1) for t in (query, key, value))  # [heads, N, d]
    scores = torch.matmul(query, key.transpose(1, 2)) * attn.scaling + mask
    out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype), value)
    return attn.proj(out.transpose(0, 1).reshape(length, -1))


def text_config(model: torch.nn.Module):  # a transformers Qwen2Config
    """The language model as a Qwen2 config, its rope_scaling keeping the M-RoPE sections."""
    import transformers

    config = model.config.text_config.to_dict()
    rope = dict(config.get("rope_scaling") or {})
    section = rope.get("mrope_section")
    rope = {"rope_type": "default", "mrope_section": list(section)} if rope.get("rope_type", rope.get("type")) in ("mrope", "default") else rope
    config.update(rope_scaling=rope, architectures=["Qwen2ForCausalLM"])
    for key in ("model_type", "transformers_version", "_name_or_path"):
        config.pop(key, None)
    return transformers.Qwen2Config(**config)


class _MropeKeyFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "mrope_section" not in record.getMessage()


@contextlib.contextmanager
def quiet_mrope_keys() -> Iterator[None]:
    """transformers warns of an unrecognised `mrope_section` key each time a Qwen2 config holding one is built:
    expected here (the decoder export reads it), so not shown."""
    logger, quiet = logging.getLogger("transformers.modeling_rope_utils"), _MropeKeyFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def example_inputs(config) -> tuple[torch.Tensor, ...]:  # the vision config
    """Two images of 4x4 and 4x6 patches (16 + 24), in raster order (tracing needs shapes, not the real order)."""
    merge = config.spatial_merge_size
    width = config.in_channels * config.temporal_patch_size * config.patch_size ** 2
    grids = [(4 * merge // 2, 4 * merge // 2), (4 * merge // 2, 6 * merge // 2)]
    positions = torch.cat([torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2) for h, w in grids])
    images = torch.cat([torch.full((h * w,), i) for i, (h, w) in enumerate(grids)])
    count = len(positions)  # windows of 16 patches, the last padded
    windows = -(-count // 16)
    index = torch.arange(windows * 16).reshape(windows, 16)
    mask = (index < count).long()
    return torch.randn(count, width), positions, images, torch.where(mask.bool(), index, 0), mask, torch.arange(count)


def processor_settings(source: Path, model: torch.nn.Module) -> dict:
    """The source's Qwen2-VL image processor settings (preprocessor_config.json), or its defaults."""
    path = source / "preprocessor_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    vision = model.config.vision_config
    size = config.get("size") or {}
    return {"patch_size": int(config.get("patch_size", vision.patch_size)), "merge_size": int(config.get("merge_size", vision.spatial_merge_size)),
            "temporal_patch_size": int(config.get("temporal_patch_size", vision.temporal_patch_size)),
            "min_pixels": int(config.get("min_pixels") or size.get("shortest_edge", 56 * 56)),
            "max_pixels": int(config.get("max_pixels") or size.get("longest_edge", 28 * 28 * 1280)),
            "rescale_factor": float(config.get("rescale_factor", 1 / 255)),
            "image_mean": list(config.get("image_mean", [0.48145466, 0.4578275, 0.40821073])),
            "image_std": list(config.get("image_std", [0.26862954, 0.26130258, 0.27577711])),
            "resample": int(config.get("resample", 3)), "do_convert_rgb": bool(config.get("do_convert_rgb", True)),
            # the tower's windows in merged tokens (Qwen2.5-VL; 0: every layer attends over the whole image)
            "window_units": int(getattr(vision, "window_size", 0) // vision.spatial_merge_size // vision.patch_size)
            if getattr(vision, "fullatt_block_indexes", None) is not None else 0}



def trace(model: torch.nn.Module, path: Path) -> None:
    axes = {name: {0: "num_patches"} for name in VISION_INPUTS}
    axes.update({name: {0: "num_windows", 1: "window_length"} for name in ("window_index", "window_mask")})
    torch.onnx.export(QwenVisionGraph(model.model.visual).eval(), example_inputs(model.config.vision_config), str(path),
                      dynamo=False, input_names=list(VISION_INPUTS), output_names=[IMAGE_EMBEDS], opset_version=OPSET,
                      dynamic_axes={**axes, IMAGE_EMBEDS: {0: "num_image_tokens"}})


def spec(model: torch.nn.Module, source: Path) -> VisionSpec:
    """Images keep their own size (tokens_per_image 0), between the vision start and end tokens."""
    config = model.config
    return VisionSpec(image_token_id=int(config.image_token_id), tokens_per_image=0, image_size=0,
                      processor=processor_settings(source, model), family="qwen2_vl",
                      merge_size=int(config.vision_config.spatial_merge_size), image_start_id=int(config.vision_start_token_id),
                      image_end_id=int(config.vision_end_token_id))


def patch_width(model: torch.nn.Module) -> int:
    config = model.config.vision_config
    return config.in_channels * config.temporal_patch_size * config.patch_size ** 2


def random_feeds(model: torch.nn.Module, vision: VisionSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The vision graph's inputs for two random images, of 4x6 and 6x4 patches."""
    merge = vision.merge_size
    images = [(rng.standard_normal((r * c * merge * merge, patch_width(model))).astype(np.float32), (r, c)) for r, c in [(2, 3), (3, 2)]]
    return qwen_vision_feeds(images, merge, int(vision.processor.get("window_units", 0)))[0]


def example(model: torch.nn.Module, vision: VisionSpec, rng: np.random.Generator) -> Example:
    """A 2 x 3-token image (rows x columns of merged patches) between the vision start and end tokens."""
    merge, config, grid = vision.merge_size, model.config, (2, 3)
    patches = rng.standard_normal((grid[0] * grid[1] * merge * merge, patch_width(model))).astype(np.float32)
    inputs = {"pixel_values": torch.from_numpy(patches), "image_grid_thw": torch.tensor([[1, grid[0] * merge, grid[1] * merge]])}
    ids = [5, config.vision_start_token_id] + [vision.image_token_id] * (grid[0] * grid[1]) + [config.vision_end_token_id, 9, 11]
    return ids, inputs, PlacedImage(2, EncoderInput.of(patches, grid[0] * grid[1], "image"), grid)


FAMILY = VisionFamily(
    "Qwen2-VL", {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"},
    {"qwen2_vl": "Qwen2-VL (Qwen/Qwen2-VL-*): images at their own resolution, M-RoPE",
     "qwen2_5_vl": "Qwen2.5-VL (Qwen/Qwen2.5-VL-*): windowed vision attention, images at their own resolution, M-RoPE"},
    trace, spec, text_config=text_config, random_feeds=random_feeds, example=example, quiet=quiet_mrope_keys,
)


__all__ = ["FAMILY", "VISION_INPUTS", "QwenVisionGraph", "example_inputs", "processor_settings", "quiet_mrope_keys", "text_config"]
