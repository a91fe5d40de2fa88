"""Images in: decoding (Pillow) with limits, and each family's preprocessing in numpy, as transformers' image
processor does it (no torch, no torchvision at serving time).

CLIP's (LLaVA 1.5): RGB, resize so the shortest edge is `resize_shortest_edge` (Pillow, bicubic), center crop,
rescale by 1/255, normalise by the mean and std, channels first. tests/runtime/test_vision.py checks it against
transformers' CLIPImageProcessor on images of several sizes and modes.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ortinf.errors import RequestError

MAX_PIXELS = 50_000_000  # width x height an image may declare (a 30000 x 30000 header is refused before decoding)
MAX_SIDE = 16_384


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
            raise RequestError(f"the image cannot be decoded ({str(exc)[:120] or type(exc).__name__}): send a PNG, JPEG, WebP "
                               "or GIF", param=param) from exc
    if image.size[0] < 1 or image.size[1] < 1:
        raise RequestError(f"the image is empty ({image.size[0]}x{image.size[1]})", param=param)
    return image


def clip_pixels(image, processor: dict) -> np.ndarray:  # noqa: ANN001 - a PIL image
    """[3, crop_height, crop_width] float32 pixel values, as CLIPImageProcessor computes them."""
    from PIL import Image

    if processor.get("do_convert_rgb", True) and image.mode != "RGB":
        image = image.convert("RGB")
    width, height = image.size
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
    values = pixels.astype(np.float32) * np.float32(processor.get("rescale_factor", 1 / 255))
    mean, std = np.asarray(processor["image_mean"], np.float32), np.asarray(processor["image_std"], np.float32)
    return np.ascontiguousarray(((values - mean) / std).transpose(2, 0, 1).astype(np.float32))


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


__all__ = ["MAX_PIXELS", "clip_pixels", "load_image"]
