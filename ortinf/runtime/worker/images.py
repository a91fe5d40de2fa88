"""Images in: decoding (Pillow) with limits, and the preprocessing steps the families share, in numpy, as
transformers' image processors do them (no torch, no torchvision at serving time). What is one family's alone
(Qwen2-VL's patches, LLaVA-NeXT's tiles, Idefics3's) is in its file in ortinf/runtime/worker/vision_families/.

CLIP's (LLaVA 1.5, and Gemma 3's plain resize): RGB, resize so the shortest edge is `resize_shortest_edge` (Pillow,
bicubic), center crop, rescale by 1/255, normalise by the mean and std, channels first.
tests/runtime/worker/test_vision.py checks it against transformers' CLIPImageProcessor on images of several sizes
and modes.
"""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ortinf.errors import RequestError

MAX_PIXELS = 50_000_000  # width x height an image may declare (a 30000 x 30000 header is refused before decoding)
MAX_SIDE = 16_384
MAX_REQUEST_PIXELS = 64_000_000  # all of a request's images together: 8 images of 49M pixels decoded to 1.6 GB before


def load_image(source: Any, param: str = "image"):  # a PIL image
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


def clip_pixels(image, processor: dict) -> np.ndarray:  # a PIL image
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
    "check_request_pixels",
    "clip_pixels",
    "load_image",
]
