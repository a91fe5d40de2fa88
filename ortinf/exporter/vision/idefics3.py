"""Idefics3 and SmolVLM (issue 33): the family's export record and the parts that differ from LLaVA's
(ortinf/exporter/vision/llava.py; the frame: ortinf/exporter/vision_language.py).

The processor resizes an image (longest edge to `longest_edge`, then up to multiples of the tile size) and cuts it
into tiles of the tower's size, row by row, plus the whole image at tile size
(ortinf/runtime/worker/vision_families/idefics3.py `idefics_tiles`). Every tile is full-size, so the tower's
position ids are one constant vector and its patch mask is all ones: the graph here is transformers' vision model
and connector (pixel shuffle, projection) for full tiles, batched over tiles, without its per-image Python loop (a
trace would freeze the example's tile count).

The prompt writes each image as text and image tokens (Idefics3Processor's get_image_prompt_string):

    per tile row r, column c:  <fake_token_around_image> <row_r_col_c> <image> x seq_len     then "\\n" after each row
    then:  "\\n" <fake_token_around_image> <global-img> <image> x seq_len <fake_token_around_image>

(an image no larger than a tile: the last line alone, without its leading "\\n"). The ids of those texts come from the
source's tokenizer at export (VisionSpec.processor["expansion"]); the engine writes them around each image's tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ortinf.errors import ExportError
from ortinf.exporter.vision.family import Example, VisionFamily, trace_images
from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage
from ortinf.runtime.worker.vision_families.idefics3 import prompt_tokens


class TileGraph(torch.nn.Module):
    """pixel_values [tiles, 3, S, S] -> [tiles, seq_len, hidden]: the tower over full tiles, then the connector."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.vision = model.model.vision_model
        self.connector = model.model.connector
        # a full tile's position ids, as Idefics3VisionEmbeddings computes them (its fractional coordinates are scaled by
        # 1 - 1e-6 before bucketing, so they are not simply 0 .. n - 1): a constant of the graph
        side = self.vision.embeddings.num_patches_per_side
        boundaries = torch.arange(1 / side, 1.0, 1 / side)
        coords = torch.bucketize(torch.arange(side, dtype=torch.float32) / side * (1 - 1e-6), boundaries, right=True)
        self.register_buffer("position_ids", (coords[:, None] * side + coords[None, :]).flatten(), persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        embeddings = self.vision.embeddings
        patches = embeddings.patch_embedding(pixel_values.to(embeddings.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        hidden = patches + embeddings.position_embedding(self.position_ids)[None]
        hidden = self.vision.encoder(inputs_embeds=hidden, attention_mask=None).last_hidden_state
        return self.connector(self.vision.post_layernorm(hidden))


def expansion(source: Path, tokens_per_tile: int, per_side: int) -> dict:
    """The prompt's tokens for an image of each tile layout ("rows,cols", "0,0" unsplit), from the source's tokenizer:
    get_image_prompt_string's text tokenized whole (a tokenizer may join its "\n\n"), with one image token per tile
    (the image tokens are special tokens, so the text between them tokenizes alike at any run length; the engine
    writes each as `tokens_per_tile`)."""
    from tokenizers import Tokenizer

    path = source / "tokenizer.json"
    if not path.is_file():
        raise ExportError(f"{source} has no tokenizer.json: Idefics3's images are written into the prompt as text tokens")
    tokenizer = Tokenizer.from_file(str(path))

    def text(rows: int, cols: int) -> str:  # transformers' get_image_prompt_string with image_seq_len 1
        fake, image, whole = "<fake_token_around_image>", "<image>", "<global-img>"
        tiles = "".join("".join(f"{fake}<row_{r}_col_{c}>{image}" for c in range(1, cols + 1)) + "\n" for r in range(1, rows + 1))
        return tiles + ("\n" if rows else "") + f"{fake}{whole}{image}{fake}"

    layouts = [(0, 0)] + [(r, c) for r in range(1, per_side + 1) for c in range(1, per_side + 1)]
    return {"tokens_per_tile": tokens_per_tile,
            "layouts": {f"{r},{c}": tokenizer.encode(text(r, c), add_special_tokens=False).ids for r, c in layouts}}


def processor_settings(source: Path, model: torch.nn.Module, tokens_per_tile: int) -> dict:
    """Idefics3ImageProcessor's settings (preprocessor_config.json) and the prompt expansion."""
    path = source / "preprocessor_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    tile = int((config.get("max_image_size") or {}).get("longest_edge", model.config.vision_config.image_size))
    longest = int((config.get("size") or {}).get("longest_edge", 4 * tile))
    return {"longest_edge": longest, "tile": tile,
            "do_image_splitting": bool(config.get("do_image_splitting", True)), "resample": int(config.get("resample", 1)),
            "rescale_factor": float(config.get("rescale_factor", 1 / 255)), "image_mean": list(config.get("image_mean", [0.5] * 3)),
            "image_std": list(config.get("image_std", [0.5] * 3)),
            "expansion": expansion(source, tokens_per_tile, max(1, -(-longest // tile)))}


def tokens_per_tile(model: torch.nn.Module) -> int:
    vision = model.config.vision_config
    return (vision.image_size // vision.patch_size) ** 2 // model.config.scale_factor ** 2



def trace(model: torch.nn.Module, path: Path) -> None:
    trace_images(TileGraph(model), model.config.vision_config.image_size, path, count="num_tiles")


def spec(model: torch.nn.Module, source: Path) -> VisionSpec:
    """A tile's tokens; the prompt's text around each tile (processor["expansion"])."""
    per_tile = tokens_per_tile(model)
    return VisionSpec(image_token_id=int(model.config.image_token_id), tokens_per_image=per_tile,
                      image_size=int(model.config.vision_config.image_size),
                      processor=processor_settings(source, model, per_tile), family="idefics3")


def language_model(model: torch.nn.Module) -> torch.nn.Module:
    return model.model.text_model


def example(model: torch.nn.Module, vision: VisionSpec, rng: np.random.Generator) -> Example:
    """An image of one tile: <fake><global-img> its tokens <fake>."""
    size = vision.image_size
    pixels = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    tokens, rows = prompt_tokens(0, 0, vision.image_token_id, vision.processor["expansion"])
    ids = [5, 7, *tokens, 9, 11]
    placed = PlacedImage(2 + rows[0], EncoderInput.of(pixels, len(rows), "image"), rows=tuple(r - rows[0] for r in rows),
                         span=len(tokens) - rows[0])
    return ids, {"pixel_values": torch.from_numpy(pixels[None])}, placed


FAMILY = VisionFamily(
    "Idefics3", {"idefics3": "Idefics3ForConditionalGeneration", "smolvlm": "SmolVLMForConditionalGeneration"},
    {"idefics3": "Idefics3 (HuggingFaceM4/Idefics3-8B-Llama3) and SmolVLM (HuggingFaceTB/SmolVLM-*): images in tiles, pixel shuffle",
     "smolvlm": "SmolVLM2 (HuggingFaceTB/SmolVLM2-*): Idefics3's layout with its own classes"},
    trace, spec, language_model=language_model, example=example,
)


__all__ = ["FAMILY", "TileGraph", "processor_settings", "tokens_per_tile"]
