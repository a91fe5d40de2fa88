"""Images in chat messages: data URLs decoded here; http(s) URLs fetched only from the hosts `--allowed-media-domains`
names (vLLM's option; none by default: fetching would let any client make the server reach any host), with a
size limit, a time limit and every redirect held to the same hosts."""

from __future__ import annotations

import base64
import binascii
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from ortinf.errors import ConfigError, RequestError

MAX_IMAGES_PER_PROMPT = 8  # default of --limit-mm-per-prompt
MAX_IMAGE_BYTES = 20 << 20
DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<base64>;base64)?,(?P<data>.*)", re.S)


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    """What the server accepts: images per prompt, the hosts image URLs may name, the time a fetch may take."""

    max_images: int = MAX_IMAGES_PER_PROMPT
    allowed_domains: tuple[str, ...] = ()
    fetch_timeout: float = 5.0
    max_bytes: int = MAX_IMAGE_BYTES

    def allows(self, url: str) -> bool:
        host = (urllib.parse.urlsplit(url).hostname or "").lower()
        return bool(host) and host in {d.lower() for d in self.allowed_domains}


def parse_limit_mm_per_prompt(value: str) -> int:
    """vLLM's --limit-mm-per-prompt: `image=N` or JSON `{"image": N}`; the image limit (other modalities: an error)."""
    import json

    text = value.strip()
    try:
        items = json.loads(text) if text.startswith("{") else dict(part.split("=", 1) for part in text.split(",") if part.strip())
    except (ValueError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--limit-mm-per-prompt {value!r}: write image=N (or JSON {{\"image\": N}})") from exc
    unknown = sorted(set(items) - {"image"})
    if unknown:
        raise ConfigError(f"--limit-mm-per-prompt: ortinf takes images only, not {', '.join(unknown)}: write image=N")
    try:
        limit = int(items.get("image", MAX_IMAGES_PER_PROMPT))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--limit-mm-per-prompt {value!r}: the image count must be an integer") from exc
    if limit < 0:
        raise ConfigError(f"--limit-mm-per-prompt {value!r}: the image count must be 0 or more")
    return limit


def image_bytes(url: str, policy: MediaPolicy = MediaPolicy()) -> bytes:
    """The encoded image in a data URL, or fetched from an allowed host; RequestError for anything else."""
    if url.startswith(("http://", "https://")):
        return fetch(url, policy)
    match = DATA_URL.fullmatch(url) if url.startswith("data:") else None
    if match is None or not match.group("base64"):
        raise RequestError("an image_url must be a base64 data URL (data:image/png;base64,...) or an http(s) URL", param="messages")
    data = match.group("data")
    if len(data) > policy.max_bytes * 4 // 3 + 4:
        raise RequestError(f"the image is larger than {policy.max_bytes >> 20} MiB", param="messages")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(f"the image's base64 is not valid: {exc}", param="messages") from exc


class _HeldRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an allowed host (else a fetch could be bounced anywhere)."""

    def __init__(self, policy: MediaPolicy) -> None:
        self.policy = policy

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 - urllib's signature
        if not self.policy.allows(newurl):
            raise RequestError(f"the image URL redirects to {urllib.parse.urlsplit(newurl).hostname}, which "
                               "--allowed-media-domains does not name", param="messages")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch(url: str, policy: MediaPolicy) -> bytes:
    """An image from an http(s) URL on an allowed host: at most max_bytes, within fetch_timeout in all."""
    host = urllib.parse.urlsplit(url).hostname
    if not policy.allowed_domains:
        raise RequestError("fetching image URLs is off on this server: send the image inline as a data URL "
                           "(data:image/png;base64,...), or start the server with --allowed-media-domains", param="messages")
    if not policy.allows(url):
        raise RequestError(f"{host} is not in this server's --allowed-media-domains: send the image inline as a data URL",
                           param="messages")
    opener = urllib.request.build_opener(_HeldRedirects(policy))
    request = urllib.request.Request(url, headers={"User-Agent": "ortinf"})
    deadline = time.monotonic() + policy.fetch_timeout
    try:
        with opener.open(request, timeout=policy.fetch_timeout) as response:
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > policy.max_bytes:
                raise RequestError(f"the image at the URL is larger than {policy.max_bytes >> 20} MiB", param="messages")
            data = bytearray()
            while len(data) <= policy.max_bytes:  # in pieces, so that a slow sender cannot hold the request past the limit
                piece = response.read(1 << 16)
                if not piece:
                    break
                data += piece
                if time.monotonic() > deadline:
                    raise TimeoutError("too slow")
    except RequestError:
        raise
    except urllib.error.HTTPError as exc:
        raise RequestError(f"the image URL answered HTTP {exc.code}", param="messages") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, unresolvable, timed out
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise RequestError(f"the image URL did not answer within {policy.fetch_timeout:g} s (--media-fetch-timeout)",
                               param="messages") from exc
        raise RequestError(f"the image URL could not be fetched: {reason}", param="messages") from exc
    if len(data) > policy.max_bytes:
        raise RequestError(f"the image at the URL is larger than {policy.max_bytes >> 20} MiB", param="messages")
    return bytes(data)


def message_images(messages: list, policy: MediaPolicy = MediaPolicy()) -> list[bytes]:
    """Every image of a conversation, in order, decoded from its data URL or fetched."""
    urls = [url for m in messages for url in m.image_urls()]
    if len(urls) > policy.max_images:
        raise RequestError(f"{len(urls)} images: at most {policy.max_images} per conversation on this server "
                           "(--limit-mm-per-prompt)", param="messages")
    return [image_bytes(url, policy) for url in urls]


__all__ = ["MAX_IMAGES_PER_PROMPT", "MediaPolicy", "image_bytes", "message_images", "parse_limit_mm_per_prompt"]
