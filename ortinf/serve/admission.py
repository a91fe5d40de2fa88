"""Admission: how many requests the server holds (running plus queued), the ticket each admitted request holds
until it ends however it ends, and the preparation of a request (rendering, image fetches) off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ortinf.runtime.engine.async_engine import AsyncEngine
from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.runtime.engine.prepared import PreparedRequest
from ortinf.serve.errors import APIError
from ortinf.serve.streaming import final_outputs, until_disconnected
from ortinf.tasks.chat.media import in_media_pool

T = TypeVar("T")


class Ticket:
    """`count` admitted samples; released exactly once, whichever path ends the request first."""

    def __init__(self, admission: Admission, count: int) -> None:
        self.admission, self.count, self.released = admission, count, False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission.in_flight -= self.count


class Admission:
    """Bounds the requests in the server: max_num_seqs running plus max_queued_requests waiting.

    Past that, a request gets 429 with Retry-After at once; nothing admitted is ever dropped. A
    request that could never fit (more samples than the capacity) gets 400.
    """

    def __init__(self, max_running: int, max_queued: int) -> None:
        self.capacity = max_running + max_queued
        self.in_flight = 0
        self.closed: BaseException | None = None  # the drain deadline's error: what every request still preparing gets
        self._closing = asyncio.Event()

    def close(self, error: BaseException) -> None:
        """The drain deadline (on the event loop): requests still preparing (rendering, fetching and decoding images) end
        with `error` now, and nothing more is admitted."""
        self.closed = error
        self._closing.set()

    async def until_closed(self) -> None:
        await self._closing.wait()

    def acquire(self, count: int) -> Ticket:
        if self.closed is not None:
            raise self.closed
        if count > self.capacity:
            raise APIError(400, f"the request asks for {count} sequences (prompts x n, or its beams: best_of); this server runs "
                                f"at most {self.capacity} at once: split it, or ask for fewer", param="n")
        if self.in_flight + count > self.capacity:
            raise APIError(429, f"the server is at capacity ({self.capacity} requests in flight); retry shortly",
                           code="server_overloaded", headers={"Retry-After": "1"})
        self.in_flight += count
        return Ticket(self, count)


class AdmittedStream(StreamingResponse):
    """A streaming response that releases its admission ticket however it ends, also when the
    client is gone before the body generator ever starts (a never-started generator's `finally`
    never runs)."""

    def __init__(self, content: AsyncIterator[str], ticket: Ticket) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.ticket = ticket

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ticket.release()
            await self.body_iterator.aclose()  # type: ignore[attr-defined] - aborts the engine requests


def sequences(prepared: Sequence[PreparedRequest]) -> int:
    """The sequences `prepared` runs at once: one per sample, a beam search's beams (its n samples share one search)."""
    searches = {id(p): p.params.num_beams for p in prepared if p.params.num_beams > 1}
    return sum(1 for p in prepared if p.params.num_beams <= 1) + sum(searches.values())


async def prepare_off_loop(admission: Admission, prepare: Callable[[], T], images: bool, count: int) -> T:
    """`prepare()` (rendering, tokenising, a vision request's image fetches and decodes) off the event loop. With
    images it holds `count` of the admission's capacity while it runs (past capacity: 429 before any image is
    fetched or decoded) and runs on the media pool (ortinf/tasks/chat/media.py), never the shared one."""
    if not images:
        return await _unless_closed(admission, asyncio.to_thread(prepare))
    ticket = admission.acquire(count)
    try:
        return await _unless_closed(admission, in_media_pool(prepare))
    finally:
        ticket.release()


async def _unless_closed(admission: Admission, work: Awaitable[T]) -> T:
    """`work`, or the drain deadline's error if it comes first (the thread preparing goes on; its result is dropped)."""
    task = asyncio.ensure_future(work)
    closing = asyncio.ensure_future(admission.until_closed())
    try:
        await asyncio.wait({task, closing}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        raise admission.closed  # type: ignore[misc]
    finally:
        closing.cancel()


async def admit_and_run(request: Request, admission: Admission, engine: AsyncEngine, prepared: Sequence[PreparedRequest],
                        request_id: str, stream: AsyncIterator[str] | None) -> list[RequestOutput] | StreamingResponse:
    """Admits the samples (429 past capacity; a beam search counts as its beams), then returns a streaming response
    over `stream` (which releases them however it ends) or runs them to the end and returns their final outputs."""
    ticket = admission.acquire(sequences(prepared))
    if stream is not None:
        return AdmittedStream(stream, ticket)
    try:
        return await until_disconnected(request, final_outputs(engine, prepared, request_id))
    finally:
        ticket.release()
