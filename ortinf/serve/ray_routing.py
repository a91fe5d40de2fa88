"""Prefix-aware routing across Ray Serve replicas (`ortinf serve --ray --prefix-routing`).

Ray's router never sees an HTTP body (the proxy streams it to the replica after routing), so the
routing key is made one hop earlier: a light front deployment (FastAPI, no engine) reads the body,
takes the prompt's beginning (a completion's prompt, or a chat's messages in order) and calls the
engine deployment through a DeploymentHandle with that key as the first argument. The engine
deployment's `PrefixAffinityRouter` ranks replicas by rendezvous hashing of the key, so requests
that share a prefix land on the replica whose prefix cache holds it, and adding or losing a replica
moves only the keys that hashed to it. When the preferred replica's queue is `imbalanced_threshold`
requests longer than the shortest known one, the request goes to the least loaded instead (Ray's
power-of-two choice among all), as ray.serve.llm's PrefixCacheAffinityRouter does.

The key is the first KEY_CHARS characters of the prompt text (or the token ids' first KEY_TOKENS):
the front has no tokenizer, and equal text prefixes give equal token prefixes, which is what the
prefix cache matches.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

KEY_CHARS = 256
KEY_TOKENS = 64


def routing_key(body: bytes) -> str | None:
    """The prefix a request's prompt starts with, or None (not JSON, no prompt: any replica will do)."""
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict):
        return None
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: keyed by its first prompt
    if isinstance(prompt, str):
        return prompt[:KEY_CHARS]
    if isinstance(prompt, list):
        return json.dumps(prompt[:KEY_TOKENS])
    messages = request.get("messages")
    if isinstance(messages, list):
        text = "".join(f"{m.get('role')}:{m.get('content')}\n" for m in messages if isinstance(m, dict))
        return text[:KEY_CHARS]
    return None


def _score(key: str, replica: RunningReplica) -> int:
    digest = hashlib.blake2b(f"{key}\0{replica.replica_id.unique_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Rendezvous hashing of the routing key (the call's first argument) with a load-imbalance fallback."""

    def initialize_state(self, imbalanced_threshold: int = 8, **_: object) -> None:
        self.imbalanced_threshold = imbalanced_threshold

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        key = pending_request.args[0] if pending_request is not None and pending_request.args else None
        if not isinstance(key, str) or len(candidate_replicas) < 2:
            return [candidate_replicas]
        ranked = sorted(candidate_replicas, key=lambda replica: _score(key, replica), reverse=True)
        lengths = {r.replica_id: self.replica_queue_len_cache.get(r.replica_id) for r in ranked}
        known = [n for n in lengths.values() if n is not None]
        preferred = lengths[ranked[0].replica_id]
        if known and preferred is not None and preferred - min(known) > self.imbalanced_threshold:
            return [candidate_replicas]  # too far behind: the least loaded replica instead
        return [[ranked[0]], ranked[1:]]


async def run_asgi(app, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> AsyncIterator[dict]:
    """Runs one HTTP request through an ASGI app in-process, yielding its response messages (the
    start, then body chunks) as the app sends them; closing the iterator cancels the request."""
    messages: asyncio.Queue = asyncio.Queue()
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays until the response ends or this is cancelled
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query, "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80)}
    task = asyncio.ensure_future(app(scope, receive, messages.put))
    try:
        while True:
            getter = asyncio.ensure_future(messages.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                task.result()  # the app ended without finishing its response: raise its error
                return
            message = getter.result()
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                return
    finally:
        if not task.done():
            task.cancel()
