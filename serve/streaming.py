"""Running a request's samples: merged streams, client-disconnect detection, SSE framing, admission."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ortinf.runtime.async_engine import AsyncEngine
from ortinf.runtime.engine import PreparedRequest
from ortinf.runtime.outputs import RequestOutput
from ortinf.serve.errors import APIError, error_body, from_exception

T = TypeVar("T")
_DONE = object()


class Admission:
    """Bounds the requests in the server: max_num_seqs running plus max_queued_requests waiting.

    Past that, a request gets 429 with Retry-After at once; nothing admitted is ever dropped.
    """

    def __init__(self, max_running: int, max_queued: int) -> None:
        self.capacity = max_running + max_queued
        self.in_flight = 0

    def acquire(self, count: int) -> None:
        if self.in_flight + count > self.capacity:
            raise APIError(429, f"the server is at capacity ({self.capacity} requests in flight); retry shortly",
                           code="server_overloaded", headers={"Retry-After": "1"})
        self.in_flight += count

    def release(self, count: int) -> None:
        self.in_flight -= count


async def merged(engine: AsyncEngine, prepared: Sequence[PreparedRequest], request_id: str) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yields (sample index, output) from all samples as they arrive; closing it aborts them all."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, item: PreparedRequest) -> None:
        try:
            async for output in engine.generate(item, request_id=f"{request_id}-{index}"):
                await queue.put((index, output))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put((index, exc))
        finally:
            await queue.put((index, _DONE))

    tasks = [asyncio.create_task(pump(i, item)) for i, item in enumerate(prepared)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()  # each task's stream closes, which aborts its request


async def final_outputs(engine: AsyncEngine, prepared: Sequence[PreparedRequest], request_id: str) -> list[RequestOutput]:
    finals: list[RequestOutput | None] = [None] * len(prepared)
    async for index, output in merged(engine, prepared, request_id):
        finals[index] = output
    return finals  # type: ignore[return-value]


async def until_disconnected(request: Request, work: Awaitable[T], poll: float = 0.1) -> T:
    """Runs `work`, cancelling it (and so aborting its requests) if the client goes away."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client disconnected")
    finally:
        if not task.done():
            task.cancel()


async def admit_and_run(request: Request, admission: Admission, engine: AsyncEngine, prepared: Sequence[PreparedRequest],
                        request_id: str, stream: AsyncIterator[str] | None) -> list[RequestOutput] | StreamingResponse:
    """Admits the samples (429 past capacity), then returns a StreamingResponse over `stream` (whose
    own `finally` releases them) or runs them to the end and returns their final outputs."""
    admission.acquire(len(prepared))
    if stream is not None:
        return StreamingResponse(stream, media_type="text/event-stream")
    try:
        return await until_disconnected(request, final_outputs(engine, prepared, request_id))
    finally:
        admission.release(len(prepared))


async def sse_stream(chunks: AsyncIterator[dict], admission: Admission, count: int, last: Callable[[], dict | None]) -> AsyncIterator[str]:
    """Frames a route's chunks as server-sent events: the chunks, then `last()` (the usage chunk, if
    asked for), an error event if anything failed (headers are already sent), and [DONE]. Releases
    the `count` admitted samples however it ends."""
    try:
        async for chunk in chunks:
            yield sse(chunk)
        final = last()
        if final is not None:
            yield sse(final)
    except Exception as exc:  # noqa: BLE001 - reported in the stream, whose headers are already sent
        yield sse_error(exc)
    finally:
        admission.release(count)
    yield SSE_DONE


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def sse_error(exc: BaseException) -> str:
    err = from_exception(exc)
    return sse(error_body(err.status, err.message, err.param, err.code))
