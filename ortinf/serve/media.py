"""Images in chat messages: data URLs decoded here; remote URLs are refused (fetching them would let a request
make the server reach any host: send the image inline, as base64)."""

from __future__ import annotations

import base64
import binascii
import re

from ortinf.errors import RequestError

MAX_IMAGES_PER_PROMPT = 8  # vLLM's --limit-mm-per-prompt, fixed here
MAX_IMAGE_BYTES = 20 << 20
DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<base64>;base64)?,(?P<data>.*)", re.S)


def image_bytes(url: str) -> bytes:
    """The encoded image in a data URL; RequestError for anything else."""
    if url.startswith(("http://", "https://")):
        raise RequestError("fetching image URLs is off on this server: send the image inline as a data URL "
                           "(data:image/png;base64,...)", param="messages")
    match = DATA_URL.fullmatch(url) if url.startswith("data:") else None
    if match is None or not match.group("base64"):
        raise RequestError("an image_url must be a base64 data URL (data:image/png;base64,...)", param="messages")
    data = match.group("data")
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise RequestError(f"the image is larger than {MAX_IMAGE_BYTES >> 20} MiB", param="messages")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(f"the image's base64 is not valid: {exc}", param="messages") from exc


def message_images(messages: list) -> list[bytes]:
    """Every image of a conversation, in order, decoded from its data URL."""
    urls = [url for m in messages for url in m.image_urls()]
    if len(urls) > MAX_IMAGES_PER_PROMPT:
        raise RequestError(f"{len(urls)} images: at most {MAX_IMAGES_PER_PROMPT} per conversation", param="messages")
    return [image_bytes(url) for url in urls]


__all__ = ["MAX_IMAGES_PER_PROMPT", "image_bytes", "message_images"]
