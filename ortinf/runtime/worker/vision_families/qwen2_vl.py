"""Qwen2-VL's and Qwen2.5-VL's images: each at its own resolution, cut into patches (`qwen_patches`: RGB, resized
to the nearest multiple of patch x merge pixels on each side with the pixel count between min_pixels and
max_pixels (smart_resize), rescaled, normalised, the frame repeated to the temporal patch, cut into patches in the
processor's order, merged 2x2 groups each row-major; checked against transformers' Qwen2VLImageProcessor in
tests/runtime/worker/test_qwen_vl.py). A call concatenates images up to QWEN_PATCHES patches, with the positions,
image ids and window order the traced tower takes as inputs (ortinf/exporter/vision/qwen2_vl.py); an image's grid
gives its M-RoPE positions (ortinf/runtime/worker/mrope.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ortinf.errors import RequestError
from ortinf.manifest import VisionSpec
from ortinf.runtime.worker.encoder_input import PlacedImage
from ortinf.runtime.worker.images import normalized
from ortinf.runtime.worker.vision_families.family import ImageFamily, Run

# patches per call of a Qwen2-VL tower (more when one image has more): its full-attention layers cost N**2 per call, so
# images are batched only while small (measured at 400M: 8 images of 1024-1152 patches batched by 4096 took 4.1 s an
# image against 2.0 s alone)
QWEN_PATCHES = 1024


def preprocess(image, vision: VisionSpec) -> tuple[np.ndarray, int, tuple[int, int]]:  # a PIL image
    """(patches, the tokens they merge into, the tokens as rows x columns: the M-RoPE grid)."""
    patches, (rows, cols) = qwen_patches(image, vision.processor)
    merge = vision.merge_size
    return patches, rows * cols // (merge * merge), (rows // merge, cols // merge)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' Qwen2-VL smart_resize: both sides multiples of `factor`, the area within the bounds, the aspect kept."""
    if max(height, width) / min(height, width) > 200:
        raise RequestError(f"the image is {width}x{height}: its aspect ratio must be under 200", param="image")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar, w_bar = max(factor, math.floor(height / beta / factor) * factor), max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_patches(image, processor: dict) -> tuple[np.ndarray, tuple[int, int]]:  # a PIL image
    """([patch_rows * patch_cols, C * T * P * P] float32 patches, (patch_rows, patch_cols)), as Qwen2VLImageProcessor."""
    from PIL import Image

    if processor.get("do_convert_rgb", True) and image.mode != "RGB":
        image = image.convert("RGB")
    patch, merge, temporal = processor["patch_size"], processor["merge_size"], processor["temporal_patch_size"]
    height, width = smart_resize(image.size[1], image.size[0], patch * merge, processor["min_pixels"], processor["max_pixels"])
    image = image.resize((width, height), resample=Image.Resampling(processor.get("resample", 3)))
    pixels = np.asarray(image, dtype=np.uint8)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    frame = normalized(pixels, processor).transpose(2, 0, 1)  # [C, H, W]
    rows, cols = height // patch, width // patch
    frames = np.broadcast_to(frame, (temporal, *frame.shape))
    grid = frames.reshape(1, temporal, frame.shape[0], rows // merge, merge, patch, cols // merge, merge, patch)
    patches = grid.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(rows * cols, frame.shape[0] * temporal * patch * patch)
    return np.ascontiguousarray(patches), (rows, cols)


def encode(run: Run, images: Sequence[PlacedImage], vision: VisionSpec) -> list[np.ndarray]:
    feeds, orders = qwen_vision_feeds([(p.image.data, p.grid) for p in images], vision.merge_size,
                                      int(vision.processor.get("window_units", 0)))
    (flat,) = run(feeds)
    embeds, start = [], 0
    for order in orders:  # back from window order to the image's raster order
        rows = np.empty_like(flat[start : start + len(order)])
        rows[order] = flat[start : start + len(order)]
        embeds.append(rows)
        start += len(order)
    return embeds


def window_order(rows: int, cols: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2.5-VL's get_window_index for one image of rows x cols merged tokens: the tokens in window order
    (windows of window x window tokens, row-major, clipped at the edges; each window row-major) and each one's
    window. window 0: raster order, one window."""
    index = np.arange(rows * cols).reshape(rows, cols)
    if not window:
        return index.reshape(-1), np.zeros(rows * cols, np.int64)
    padded = np.full((rows + window - rows % window, cols + window - cols % window), -1)
    padded[:rows, :cols] = index
    windows = padded.reshape(padded.shape[0] // window, window, padded.shape[1] // window, window).transpose(0, 2, 1, 3)
    windows = windows.reshape(-1, window * window)
    order = np.concatenate([w[w >= 0] for w in windows])
    ids = np.concatenate([np.full(int((w >= 0).sum()), i) for i, w in enumerate(windows)])
    return order, ids.astype(np.int64)


def qwen_vision_feeds(images: Sequence[tuple[np.ndarray, tuple[int, int]]], merge: int,
                      window: int) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The Qwen2-VL vision graph's inputs for images given as (patches in the processor's order, token grid):
    patches, their (row, column) and image and window ids, all in window order; and each image's token order
    (ortinf/exporter/vision/qwen2_vl.py)."""
    unit = merge * merge
    parts: dict[str, list[np.ndarray]] = {"pixel_values": [], "patch_positions": [], "image_ids": [], "window_ids": []}
    orders, windows_before = [], 0
    for number, (patches, (rows, cols)) in enumerate(images):
        order, ids = window_order(rows, cols, window)
        tokens = np.arange(rows * cols)
        within = np.arange(unit)
        patch_rows = ((tokens // cols)[:, None] * merge + within[None, :] // merge)[order].reshape(-1)
        patch_cols = ((tokens % cols)[:, None] * merge + within[None, :] % merge)[order].reshape(-1)
        parts["pixel_values"].append(patches.reshape(rows * cols, unit, -1)[order].reshape(rows * cols * unit, -1))
        parts["patch_positions"].append(np.stack([patch_rows, patch_cols], axis=-1).astype(np.int64))
        parts["image_ids"].append(np.full(rows * cols * unit, number, np.int64))
        parts["window_ids"].append(np.repeat(ids + windows_before, unit))
        windows_before += int(ids.max()) + 1
        orders.append(order)
    feeds = {k: np.ascontiguousarray(np.concatenate(v)) for k, v in parts.items()}
    feeds.update(window_gather(feeds.pop("window_ids")))
    return feeds, orders


def window_gather(window_ids: np.ndarray) -> dict[str, np.ndarray]:
    """The windowed layers' gather (ortinf/exporter/vision/qwen2_vl.py): each window's patches (contiguous, in order)
    padded to the largest window, which of them are real, and each patch's slot in the flattened windows."""
    counts = np.bincount(window_ids)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    width = int(counts.max())
    offsets = np.arange(width)
    mask = offsets[None, :] < counts[:, None]
    index = np.where(mask, starts[:, None] + offsets[None, :], 0)
    slot = window_ids * width + (np.arange(len(window_ids)) - starts[window_ids])
    return {"window_index": index.astype(np.int64), "window_mask": mask.astype(np.int64), "patch_slot": slot.astype(np.int64)}


FAMILY = ImageFamily("qwen2_vl", "Qwen2-VL", preprocess, encode, call_limit=QWEN_PATCHES, keeps_grid=True)

__all__ = ["FAMILY", "QWEN_PATCHES", "qwen_patches", "qwen_vision_feeds", "smart_resize", "window_gather", "window_order"]
