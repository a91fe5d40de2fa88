"""Images in: decoding (Pillow) with limits, and each family's preprocessing in numpy, as transformers' image
processor does it (no torch, no torchvision at serving time); each family's record
(ortinf/runtime/worker/vision_families/) says which it uses.

CLIP's (LLaVA 1.5): RGB, resize so the shortest edge is `resize_shortest_edge` (Pillow, bicubic), center crop,
rescale by 1/255, normalise by the mean and std, channels first. tests/runtime/worker/test_vision.py checks it against
transformers' CLIPImageProcessor on images of several sizes and modes.

Qwen2-VL's (and Qwen2.5-VL's): RGB, resize to the nearest multiple of patch x merge pixels on each side with the
pixel count between min_pixels and max_pixels (smart_resize), rescale, normalise, repeat the frame to the temporal
patch, and cut into patches in the processor's order (merged 2x2 groups, each row-major). Checked against
transformers' Qwen2VLImageProcessor (tests/runtime/worker/test_qwen_vl.py).
"""

from __future__ import annotations

import io
import math
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ortinf.errors import RequestError

MAX_PIXELS = 50_000_000  # width x height an image may declare (a 30000 x 30000 header is refused before decoding)
MAX_SIDE = 16_384
MAX_REQUEST_PIXELS = 64_000_000  # all of a request's images together: 8 images of 49M pixels decoded to 1.6 GB before


def load_image(source: Any, param: str = "image"):  # noqa: ANN201 - a PIL image
    """A decoded RGB-able PIL image from a PIL image, encoded bytes, a file path or an HxWxC uint8 array;
    RequestError naming what is wrong otherwise (not an image, truncated, empty, too large)."""
    try:
        from PIL import Image
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("images need Pillow: install the vision extra", name="PIL") from exc
    if isinstance(source, Image.Image):
        image = source
    elif isinstance(source, np.ndarray):
        if source.ndim not in (2, 3) or source.dtype != np.uint8:
            raise RequestError(f"an image array must be HxW or HxWxC uint8, got {source.dtype} {source.shape}", param=param)
        image = Image.fromarray(source)
    else:
        data = Path(source).read_bytes() if isinstance(source, (str, Path)) else source
        if not isinstance(data, (bytes, bytearray)):
            raise RequestError(f"an image must be bytes, a path, an array or a PIL image, not {type(source).__name__}", param=param)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data))
                width, height = image.size
                if width * height > MAX_PIXELS or max(width, height) > MAX_SIDE:
                    raise RequestError(f"the image is {width}x{height}: at most {MAX_PIXELS:,} pixels and {MAX_SIDE} on a side",
                                       param=param)
                image.seek(0)  # an animation's first frame
                image.load()
        except RequestError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise RequestError(f"the image is too large to decode: {exc}", param=param) from exc
        except (OSError, SyntaxError, ValueError, EOFError) as exc:  # not an image, truncated, corrupt
            reason = re.sub(r"<[^<>]* at 0x[0-9a-fA-F]+>", "the data", str(exc))[:120]  # Pillow names the buffer's repr
            raise RequestError(f"the image cannot be decoded ({reason or type(exc).__name__}): send a PNG, JPEG, WebP "
                               "or GIF", param=param) from exc
    if image.size[0] < 1 or image.size[1] < 1:
        raise RequestError(f"the image is empty ({image.size[0]}x{image.size[1]})", param=param)
    return image


def declared_pixels(source: Any) -> int:
    """The pixels an image will decode to, read from its header only (0 where it cannot be read: load_image says why)."""
    if isinstance(source, np.ndarray):
        return int(source.shape[0] * source.shape[1]) if source.ndim >= 2 else 0
    try:
        from PIL import Image

        if isinstance(source, Image.Image):
            return source.size[0] * source.size[1]
        # a file is opened, not read: Pillow reads its header only (the image is read once, when it is decoded)
        opened = Path(source) if isinstance(source, (str, Path)) else io.BytesIO(source)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(opened) as image:
                width, height = image.size
        return width * height
    except Exception:  # noqa: BLE001 - not an image, no Pillow: load_image names the fault
        return 0


def check_request_pixels(images: list, param: str = "images") -> None:
    """A RequestError when a request's images together decode to more than MAX_REQUEST_PIXELS (checked on their
    headers, before any is decoded)."""
    total = sum(declared_pixels(image) for image in images)
    if total > MAX_REQUEST_PIXELS:
        raise RequestError(f"the request's images are {total:,} pixels together: at most {MAX_REQUEST_PIXELS:,} per request "
                           "(send smaller images, or fewer)", param=param)


def clip_pixels(image, processor: dict) -> np.ndarray:  # noqa: ANN001 - a PIL image
    """[3, crop_height, crop_width] float32 pixel values, as CLIPImageProcessor computes them (or [3, H, W] as
    Gemma3ImageProcessor does, with resize_height / resize_width and no crop)."""
    from PIL import Image

    if processor.get("do_convert_rgb", True) and image.mode != "RGB":
        image = image.convert("RGB")
    width, height = image.size
    if "resize_height" in processor:  # Gemma 3's: straight to the tower's size, the aspect not kept
        new_width, new_height = processor["resize_width"], processor["resize_height"]
    else:
        size = processor["resize_shortest_edge"]
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = size, int(size * long / short)
        new_width, new_height = (new_short, new_long) if width <= height else (new_long, new_short)
    image = image.resize((new_width, new_height), resample=Image.Resampling(processor.get("resample", 3)))
    pixels = np.asarray(image, dtype=np.uint8)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if processor.get("do_center_crop", True):
        pixels = center_crop(pixels, processor["crop_height"], processor["crop_width"])
    return np.ascontiguousarray(normalized(pixels, processor).transpose(2, 0, 1))


def normalized(pixels: np.ndarray, processor: dict) -> np.ndarray:
    """[H, W, C] uint8 -> float32: rescaled, then normalised by the processor's mean and std (transformers' order)."""
    values = pixels.astype(np.float32) * np.float32(processor.get("rescale_factor", 1 / 255))
    mean, std = np.asarray(processor["image_mean"], np.float32), np.asarray(processor["image_std"], np.float32)
    return ((values - mean) / std).astype(np.float32)


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


def qwen_patches(image, processor: dict) -> tuple[np.ndarray, tuple[int, int]]:  # noqa: ANN001 - a PIL image
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


def select_best_resolution(height: int, width: int, pinpoints) -> tuple[int, int]:  # noqa: ANN001 - [[h, w], ...]
    """transformers' select_best_resolution: the (h, w) keeping the most of the image, then wasting the least."""
    best, most, least = None, 0, float("inf")
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - effective
        if effective > most or (effective == most and wasted < least):
            best, most, least = (int(h), int(w)), effective, wasted
    return best


def anyres_layout(height: int, width: int, processor: dict) -> tuple[int, int, slice, slice]:
    """LLaVA-NeXT's feature grid for an image of height x width: (tile rows, tile columns, the rows and columns of the
    tiles' token grid kept after unpadding), as pack_image_features and the processor's token count compute them."""
    best_h, best_w = select_best_resolution(height, width, processor["grid_pinpoints"])
    tile, side = processor["crop_height"], processor["tokens_per_side"]
    rows, cols = best_h // tile, best_w // tile
    current_h, current_w = rows * side, cols * side
    if width / height > current_w / current_h:
        padding = (current_h - int(round(height * (current_w / width), 7))) // 2
        return rows, cols, slice(padding, current_h - padding), slice(0, current_w)
    padding = (current_w - int(round(width * (current_h / height), 7))) // 2
    return rows, cols, slice(0, current_h), slice(padding, current_w - padding)


def anyres_tiles(image, processor: dict) -> tuple[np.ndarray, int, tuple[int, int]]:  # noqa: ANN001 - a PIL image
    """([1 + tiles, 3, S, S] float32, the image's tokens, its (height, width)) as LlavaNextImageProcessor computes them:
    the whole image resized to S x S, then the image resized into the best grid resolution (aspect kept, centred on
    black) cut into S x S tiles row by row; each CLIP-normalised."""
    from PIL import Image

    if processor.get("do_convert_rgb", True) and image.mode != "RGB":
        image = image.convert("RGB")
    width, height = image.size
    resample, tile = Image.Resampling(processor.get("resample", 3)), processor["crop_height"]
    best_h, best_w = select_best_resolution(height, width, processor["grid_pinpoints"])
    scale_w, scale_h = best_w / width, best_h / height
    if scale_w < scale_h:
        new_w, new_h = best_w, min(math.ceil(height * scale_w), best_h)
    else:
        new_h, new_w = best_h, min(math.ceil(width * scale_h), best_w)
    canvas = np.zeros((best_h, best_w, 3), np.uint8)
    top, left = (best_h - new_h) // 2, (best_w - new_w) // 2
    canvas[top : top + new_h, left : left + new_w] = np.asarray(image.resize((new_w, new_h), resample=resample))
    base = processor["resize_shortest_edge"]
    frames = [np.asarray(image.resize((base, base), resample=resample))]
    frames += [canvas[r : r + tile, c : c + tile] for r in range(0, best_h, tile) for c in range(0, best_w, tile)]
    pixels = np.stack([clip_pixels(Image.fromarray(f), processor) for f in frames])
    rows, cols, keep_rows, keep_cols = anyres_layout(height, width, processor)
    kept = (keep_rows.stop - keep_rows.start) * (keep_cols.stop - keep_cols.start + 1)  # each kept row ends in a newline
    return pixels, processor["tokens_per_side"] ** 2 + kept, (height, width)


def idefics_tiles(image, processor: dict) -> tuple[np.ndarray, int, int]:  # noqa: ANN001 - a PIL image
    """([tiles, 3, S, S] float32, rows, cols) as Idefics3ImageProcessor computes them: the longest edge resized to
    `longest_edge`, then both sides up to multiples of the tile size S, cut into rows x cols tiles (row by row) and
    followed by the whole image at S x S; an image that fits one tile is that tile alone (rows = cols = 0).
    Non-RGB images are converted to RGB first (transformers converts after resizing)."""
    from PIL import Image

    if image.mode != "RGB":
        image = image.convert("RGB")
    resample, tile = Image.Resampling(processor.get("resample", 1)), processor["tile"]
    width, height = image.size
    longest = processor["longest_edge"]
    if width >= height:  # _resize_output_size_rescale_to_max_len, then below transformers' MAX_IMAGE_SIZE (4096)
        width, height = longest, int(longest / (width / height))
        height += height % 2
    else:
        height, width = longest, int(longest * (width / height))
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    if max(width, height) > 4096:
        ratio = width / height
        width, height = (4096, max(int(4096 / ratio), 1)) if width >= height else (max(int(4096 * ratio), 1), 4096)
    image = image.resize((width, height), resample=resample)
    rows = cols = 0
    if processor.get("do_image_splitting", True):  # resize_for_vision_encoder and split_image
        ratio = width / height
        if width >= height:
            width = math.ceil(width / tile) * tile
            height = math.ceil(int(width / ratio) / tile) * tile
        else:
            height = math.ceil(height / tile) * tile
            width = math.ceil(int(height * ratio) / tile) * tile
        image = image.resize((width, height), resample=resample)
        frames = []
        if height > tile or width > tile:
            rows, cols = math.ceil(height / tile), math.ceil(width / tile)
            pixels = np.asarray(image)
            step_h, step_w = math.ceil(height / rows), math.ceil(width / cols)
            frames = [pixels[r * step_h : min((r + 1) * step_h, height), c * step_w : min((c + 1) * step_w, width)]
                      for r in range(rows) for c in range(cols)]
            if (height, width) != (tile, tile):
                image = image.resize((tile, tile), resample=resample)
        frames.append(np.asarray(image))
    else:
        frames = [np.asarray(image.resize((tile, tile), resample=resample))]
    return np.ascontiguousarray(np.stack([normalized(f, processor).transpose(2, 0, 1) for f in frames])), rows, cols


def center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """transformers' center_crop: the middle height x width, zero-padded where the image is smaller."""
    h, w = pixels.shape[:2]
    if h < height or w < width:
        padded = np.zeros((max(h, height), max(w, width), pixels.shape[2]), pixels.dtype)
        top, left = (padded.shape[0] - h) // 2, (padded.shape[1] - w) // 2
        padded[top : top + h, left : left + w] = pixels
        pixels, (h, w) = padded, padded.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    return pixels[top : top + height, left : left + width]


__all__ = [
    "MAX_PIXELS",
    "MAX_REQUEST_PIXELS",
    "anyres_layout",
    "anyres_tiles",
    "check_request_pixels",
    "clip_pixels",
    "idefics_tiles",
    "load_image",
    "qwen_patches",
    "smart_resize",
]
