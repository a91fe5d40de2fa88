"""ImageFamily: how a vision-language family's images are served, one record per family that a package's manifest
names (VisionSpec.family). The runtime reads the record instead of branching on the name: the preprocessing, the
tokens a prompt's placeholder becomes, what a PlacedImage keeps, and how the vision graph is called and batched.
The export side of a family is its record in ortinf/exporter/vision/ (the exporter may read these; the runtime
never reads the exporter's, which need torch)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import PlacedImage

VISION_BATCH = 8  # images per call of the vision graph (twice as many for families whose images are tiles)

Grid = tuple[int, int] | None
# the vision graph, called with feeds (those it does not take are dropped): its outputs
Run = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def written_around(vision: VisionSpec, count: int, grid: Grid) -> tuple[list[int], list[int]]:
    """The tokens a placeholder becomes for an image of `count` tokens, and the offsets of its image tokens among
    them: the package's prefix (Gemma 3's "\\n\\n<start_of_image>"), the image tokens, its suffix."""
    prefix, suffix = list(vision.image_prefix_ids), list(vision.image_suffix_ids)
    return prefix + [vision.image_token_id] * count + suffix, list(range(len(prefix), len(prefix) + count))


@dataclass(frozen=True, slots=True)
class ImageFamily:
    """One family's serving side. `preprocess(image, vision)`: a decoded PIL image -> (pixels for the vision graph,
    the tokens it becomes, a grid: the prompt layout's or the PlacedImage's). `encode(run, images, vision)`: one call's
    images -> each image's embeddings, in prompt order."""

    name: str  # as the manifest stores it (VisionSpec.family)
    title: str  # how messages name it
    preprocess: Callable[[object, VisionSpec], tuple[np.ndarray, int, Grid]]
    encode: Callable[[Run, Sequence[PlacedImage], VisionSpec], list[np.ndarray]]
    call_limit: int  # what one call of the vision graph takes: images (per_image) or their rows (tiles, patches)
    per_image: bool = False
    layout: Callable[[VisionSpec, int, Grid], tuple[list[int], list[int]]] = written_around
    keeps_grid: bool = False  # PlacedImage.grid is the preprocessing's grid (M-RoPE's, or the unpadding's size)
    # the image's tokens lie among text tokens the layout writes (PlacedImage.rows / span): a prompt marks each image
    # with one image token, never with its tokens written out
    tokens_among_text: bool = False


def concatenated(run: Run, images: Sequence[PlacedImage]) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """One call over every image's rows (tiles) together: the graph's outputs, and each image's [start, end) rows."""
    outputs = run({"pixel_values": np.ascontiguousarray(np.concatenate([p.image.data for p in images]))})
    bounds = np.cumsum([0] + [len(p.image.data) for p in images])
    return outputs, list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


__all__ = ["VISION_BATCH", "ImageFamily", "Run", "concatenated", "written_around"]
