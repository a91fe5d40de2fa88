"""Running a request's samples from a route: merged streams, final outputs, and client-disconnect detection
(admission is ortinf/serve/admission.py, SSE framing ortinf/serve/sse.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TypeVar

from starlette.requests import Request

from ortinf.runtime.engine.async_engine import AsyncEngine
from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.runtime.engine.prepared import PreparedRequest
from ortinf.serve.errors import APIError
from ortinf.tasks import driver, text

T = TypeVar("T")


def merged(engine: AsyncEngine, prepared: Sequence[PreparedRequest], request_id: str) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yields (sample index, output) from all samples as they advance, through the engine's one
    mailbox per caller (the routes ask for deltas: what a slow consumer has not taken is joined);
    closing it aborts them all. Beam searches yield each prompt's n best when its search ends."""
    return driver.stream(engine, text.program(engine, prepared, request_id, keep=False), request_id)


async def final_outputs(engine: AsyncEngine, prepared: Sequence[PreparedRequest], request_id: str) -> list[RequestOutput]:
    """Each sample's whole output (one final output each when asked for final_only; deltas are joined)."""
    run = text.program(engine, prepared, request_id)
    await driver.finish(engine, run, request_id)
    return [run.finals[index] for index in range(len(prepared))]


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Runs `work`, cancelling it (and so aborting its requests) when the client goes away. No polling: a
    watcher awaits the connection's next ASGI message, which for a request whose body has been read is
    its http.disconnect (the server sends it when the client closes; the route's answer ends the wait)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # its requests aborted before the route ends
        raise APIError(499, "client disconnected")
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
