"""The Responses API's store: what `previous_response_id` and GET /v1/responses/{id} read.

What is kept, per stored response (`store`, default true): the response object as it was returned
(what GET answers) and the conversation a continuation starts from (the input and output as chat
messages, images as they were sent; not the instructions, which OpenAI does not carry). Both are kept
as compact JSON bytes, so that:

- a stored response is immutable: every read decodes a fresh copy, so no request (a refused one
  included) can change what the next continuation or GET sees, and two clients branching from one
  response never see each other's items;
- the bound is in bytes, exactly: the newest responses whose bytes fit in `capacity`
  (`--responses-store-size`) stay, the oldest go first. A count bound is no bound when one response
  can carry 26 MiB of images: 1,024 of them were ~30 GB.

How long: until evicted by newer ones, deleted (DELETE /v1/responses/{id}) or the server stops
(memory only, as vLLM's). A response larger than the whole store is answered but not kept.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass

from ortinf.serve.config import RESPONSES_STORE_SIZE as DEFAULT_CAPACITY
from ortinf.serve.errors import APIError

log = logging.getLogger(__name__)

ENTRY_OVERHEAD = 512  # bytes an entry costs beyond its JSON (its id, the dict slot, two bytes objects): counted against the bound


def _encode(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Stored:
    """One stored response, frozen as JSON."""

    body: bytes  # the response object as returned
    messages: bytes  # the conversation so far as chat messages (input and output, no instructions)

    @property
    def size(self) -> int:
        return len(self.body) + len(self.messages) + ENTRY_OVERHEAD

    def response(self) -> dict:
        return json.loads(self.body)

    def conversation(self) -> list[dict]:
        """A fresh copy: the caller may change it freely."""
        return json.loads(self.messages)


class ResponseStore:
    """The newest responses that fit in `capacity` bytes, in memory, oldest evicted first."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self.num_bytes = 0
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response_id: str, body: dict, messages: list[dict]) -> bool:
        """Keeps a response (a snapshot: later changes to `body` or `messages` are not seen); False
        when it alone is larger than the store."""
        stored = Stored(_encode(body), _encode(messages))
        if stored.size > self.capacity:
            if self.capacity:  # 0: the operator asked for no store
                log.warning("response %s (%d bytes) is larger than --responses-store-size (%d bytes): answered, not stored",
                            response_id, stored.size, self.capacity)
            return False
        self.delete(response_id)
        self._items[response_id] = stored
        self.num_bytes += stored.size
        while self.num_bytes > self.capacity:
            _, oldest = self._items.popitem(last=False)
            self.num_bytes -= oldest.size
        return True

    def get(self, response_id: str, param: str | None = None) -> Stored:
        stored = self._items.get(response_id)
        if stored is None:
            raise APIError(404, f"no stored response with id '{response_id[:80]}' (responses live in memory while the server "
                                f"runs: the newest that fit in --responses-store-size, {self.capacity} bytes)", param=param)
        return stored

    def delete(self, response_id: str) -> bool:
        stored = self._items.pop(response_id, None)
        if stored is not None:
            self.num_bytes -= stored.size
        return stored is not None
