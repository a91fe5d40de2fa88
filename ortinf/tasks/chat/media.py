"""Images in chat messages: data URLs decoded here; http(s) URLs fetched only from the hosts `--allowed-media-domains`
names (vLLM's option; none by default: fetching would let any client make the server reach any host), on their
default ports unless an entry names one, with a size limit, one time limit for the whole fetch and every redirect
held to the same rules.

A request with images is prepared (fetched, decoded, preprocessed) on a pool of its own (`in_media_pool`, MEDIA_THREADS
threads) after admission (ortinf/serve/admission.py `prepare_off_loop`): a slow host or a huge image then costs a
media thread and an admission slot, never the shared pool that tokenising, embeddings and rerank use (one outside
attack held that pool with trickling hosts and 7000x7000 PNGs and made an unrelated /v1/rerank take 26-56 s)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import http.client
import logging
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TypeVar

from ortinf.errors import ConfigError, RequestError

MAX_IMAGES_PER_PROMPT = 8  # default of --limit-mm-per-prompt
MAX_IMAGE_BYTES = 20 << 20
log = logging.getLogger("ortinf.serve")
MAX_REDIRECTS = 5
DEFAULT_PORTS = {"http": 80, "https": 443}  # an allowed host is fetched on these unless its entry names a port
MEDIA_THREADS = 2  # image fetches and decodes at once, in their own pool (module docstring)
T = TypeVar("T")
_pool: ThreadPoolExecutor | None = None
RESOLVER_THREADS = 4  # host-name lookups in flight; one that hangs holds its thread, never a request past its deadline
_resolver: ThreadPoolExecutor | None = None
_resolver_lock = threading.Lock()
DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<base64>;base64)?,(?P<data>.*)", re.S)


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    """What the server accepts: images per prompt, the hosts image URLs may name, the time a fetch may take."""

    max_images: int = MAX_IMAGES_PER_PROMPT
    allowed_domains: tuple[str, ...] = ()
    fetch_timeout: float = 5.0
    max_bytes: int = MAX_IMAGE_BYTES

    def allows(self, url: str) -> bool:
        """An http(s) URL whose host is named, on the scheme's default port unless the entry names another
        (`host:8080`): any other port of an allowed host would let a client probe the host's services."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port or DEFAULT_PORTS.get(parts.scheme)
        except ValueError:  # a port out of range or not a number
            return False
        host = (parts.hostname or "").lower()
        if parts.scheme not in DEFAULT_PORTS or not host:
            return False
        for entry in self.allowed_domains:
            name, named_port = split_entry(entry)
            if name == host and (named_port == port if named_port is not None else port == DEFAULT_PORTS[parts.scheme]):
                return True
        return False


def split_entry(entry: str) -> tuple[str, int | None]:
    """(host, port or None) of an --allowed-media-domains entry: `host`, `host:8080`, an IPv6 address bare (`::1`) or
    bracketed as in URLs (`[::1]`, `[::1]:8080`)."""
    entry = entry.strip().lower()
    if entry.startswith("["):
        address, _, rest = entry[1:].partition("]")
        return address, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if entry.count(":") == 1:
        name, _, port = entry.partition(":")
        return name, int(port) if port.isdigit() else None
    return entry, None


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


def fetch(url: str, policy: MediaPolicy) -> bytes:
    """An image from an http(s) URL on an allowed host: at most max_bytes, within fetch_timeout in all (connecting,
    every redirect and every read count against one deadline: a sender trickling a byte at a time is cut off at it).
    Each redirect is held to the same rules as the URL (http or https, an allowed host, its allowed port). Errors
    say what the client can change, never why a connection failed (which would tell open ports from closed ones)."""
    host = urllib.parse.urlsplit(url).hostname
    if not policy.allowed_domains:
        raise RequestError("fetching image URLs is off on this server: send the image inline as a data URL "
                           "(data:image/png;base64,...), or start the server with --allowed-media-domains", param="messages")
    if not policy.allows(url):
        raise RequestError(f"{host} is not in this server's --allowed-media-domains (or not on an allowed port): send the "
                           "image inline as a data URL", param="messages")
    deadline = time.monotonic() + policy.fetch_timeout
    try:
        for _ in range(MAX_REDIRECTS + 1):
            status, location, data = _get(url, policy, deadline)
            if location is None:
                break
            target = urllib.parse.urljoin(url, location)
            if not policy.allows(target):
                parts = urllib.parse.urlsplit(target)
                where = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if _port_of(parts) else "")
                raise RequestError(f"the image URL redirects to {where}, which --allowed-media-domains "
                                   "does not allow (an http(s) URL on a named host and port)", param="messages")
            url = target
        else:
            raise RequestError(f"the image URL redirects more than {MAX_REDIRECTS} times", param="messages")
    except RequestError:
        raise
    except TimeoutError as exc:
        raise RequestError(f"the image URL did not answer within {policy.fetch_timeout:g} s (--media-fetch-timeout)",
                           param="messages") from exc
    except (OSError, http.client.HTTPException, ValueError) as exc:  # refused, unresolvable, reset, malformed answer
        log.info("fetching %s failed: %s", url, exc)
        raise RequestError("the image URL could not be fetched", param="messages") from exc
    if status != 200:
        raise RequestError(f"the image URL answered HTTP {status}", param="messages")
    return data


def _port_of(parts: urllib.parse.SplitResult) -> int | None:
    try:
        return parts.port
    except ValueError:
        return None


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("past the fetch deadline")
    return left


def _resolve(host: str, port: int, deadline: float) -> list[tuple]:
    """The host's addresses, looked up under the fetch's deadline (the system resolver has no time limit of its own:
    a lookup that hangs keeps one of the few resolver threads and this fetch fails at its deadline)."""
    global _resolver
    with _resolver_lock:
        if _resolver is None:
            _resolver = ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="ortinf-dns")
    lookup = _resolver.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    try:
        return lookup.result(timeout=_remaining(deadline))
    except FutureTimeout as exc:
        lookup.cancel()
        raise TimeoutError("the host name was not resolved within the fetch deadline") from exc


def _connector(addresses: list[tuple], deadline: float) -> Callable:
    """http.client's create_connection, over addresses already resolved (each tried in turn, as the standard one does)."""
    def connect(_address, _timeout=None, source_address=None):  # http.client's signature
        error: OSError | None = None
        for family, kind, proto, _, sockaddr in addresses:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(_remaining(deadline))
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error or OSError("the host has no address")

    return connect


def _get(url: str, policy: MediaPolicy, deadline: float) -> tuple[int, str | None, bytes]:
    """One GET: (status, the redirect's Location or None, the body of a 200)."""
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    connection = kind(parts.hostname, port, timeout=_remaining(deadline))
    connection._create_connection = _connector(_resolve(parts.hostname, port, deadline), deadline)  # the name checked by TLS stays the host's
    try:
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        connection.request("GET", target, headers={"User-Agent": "ortinf", "Accept": "image/*"})
        sock = connection.sock  # the response reads through it; the connection lets go of it for a closing answer
        sock.settimeout(_remaining(deadline))
        response = connection.getresponse()
        if response.status in (301, 302, 303, 307, 308):
            return response.status, response.getheader("Location") or "", b""
        if response.status != 200:
            return response.status, None, b""
        declared = response.getheader("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > policy.max_bytes:
            raise RequestError(f"the image at the URL is larger than {policy.max_bytes >> 20} MiB", param="messages")
        data = bytearray()
        while True:  # read1: whatever has arrived, so the deadline is checked between the sender's pieces
            sock.settimeout(_remaining(deadline))
            piece = response.read1(1 << 16)
            if not piece:
                return 200, None, bytes(data)
            data += piece
            if len(data) > policy.max_bytes:
                raise RequestError(f"the image at the URL is larger than {policy.max_bytes >> 20} MiB", param="messages")
    finally:
        connection.close()


def message_images(messages: list, policy: MediaPolicy = MediaPolicy()) -> list[bytes]:
    """Every image of a conversation, in order, decoded from its data URL or fetched."""
    urls = [url for m in messages for url in m.image_urls()]
    if len(urls) > policy.max_images:
        raise RequestError(f"{len(urls)} images: at most {policy.max_images} per conversation on this server "
                           "(--limit-mm-per-prompt)", param="messages")
    return [image_bytes(url, policy) for url in urls]


def has_images(messages: list) -> bool:
    return any(m.image_urls() for m in messages)


async def in_media_pool(work: Callable[[], T]) -> T:
    """`work` (a request's image fetches, decodes and preprocessing) on the media pool: MEDIA_THREADS threads of
    their own, so that slow hosts and huge images never hold the pool tokenising, embeddings and rerank run on."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(MEDIA_THREADS, thread_name_prefix="ortinf-media")
    return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(work))


__all__ = ["MAX_IMAGES_PER_PROMPT", "MediaPolicy", "has_images", "image_bytes", "in_media_pool", "message_images", "parse_limit_mm_per_prompt"]
