"""Server-sent events: a route's chunks framed as SSE, an error after the headers as an error event, and [DONE]."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from ortinf.serve.errors import error_body, from_exception


async def sse_stream(chunks: AsyncIterator[dict], last: Callable[[], dict | None]) -> AsyncIterator[str]:
    """Frames a route's chunks as server-sent events: the chunks, then `last()` (the usage chunk, if
    asked for), an error event if anything failed (headers are already sent), and [DONE]."""
    try:
        async for chunk in chunks:
            yield sse(chunk)
        final = last()
        if final is not None:
            yield sse(final)
    except Exception as exc:  # noqa: BLE001 - reported in the stream, whose headers are already sent
        yield sse_error(exc)
    finally:
        await chunks.aclose()  # type: ignore[attr-defined] - closing aborts the samples still running
    yield SSE_DONE


# Characters that JSON leaves raw but that line splitters other than SSE's (Python's str.splitlines,
# JavaScript's old JSON-in-lines readers) treat as line ends: escaped, so an event is always one line.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False).translate(_LINE_BREAKS)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def sse_error(exc: BaseException) -> str:
    err = from_exception(exc)
    return sse(error_body(err.status, err.message, err.param, err.code))
