"""Running the app under uvicorn. SIGTERM: stop accepting, finish in-flight requests for up to
`shutdown_timeout` seconds, then exit 0 (uvicorn's graceful shutdown).

When the drain time is about to run out, the server ends what is still running itself (DRAIN_MARGIN
seconds before uvicorn's deadline): a non-streamed request gets an OpenAI-shaped 503, a stream an
error event and `[DONE]`, a request still preparing (a vision request decoding its images) a 503, and a
program between its requests (a beam search's next step) is refused its next one. Left to uvicorn, the
deadline cancels the request tasks: a text/plain 500, and streams cut mid-chunk with neither. Then the
process exits at once, without joining threads no client waits for."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn

from ortinf.serve.app import build_app
from ortinf.serve.config import ServerConfig

DRAIN_MARGIN = 1.0  # seconds before uvicorn's drain deadline at which the server ends what still runs


def header_deadline(base: type, seconds: float) -> type:
    """uvicorn's HTTP protocol (`base`: httptools' or h11's) with a deadline on a request's headers: a connection
    that has not finished sending them `seconds` after it opened, or after the first byte of its next request on a
    kept-alive connection, is closed. uvicorn has none: a slowloris client held 1,100 partial connections open
    forever (each a socket and a protocol object). Idle kept-alive connections are uvicorn's keep-alive timeout's."""

    class Protocol(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport) -> None:
            self._header_timer = None
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(seconds, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            if before is None or before.response_complete:  # these bytes start a request
                self._arm()
            super().data_received(data)
            if self.cycle is not None and self.cycle is not before:  # its headers are in: the request runs
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    Protocol.__name__ = f"HeaderDeadline{base.__name__}"
    return Protocol


def http_protocol(seconds: float) -> type:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # httptools is optional: uvicorn's pure-Python parser
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return header_deadline(base, seconds)


class _Server(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM after its graceful shutdown, so the process dies by the
    signal (exit -15); a drained SIGTERM is a clean stop here, and exits 0. The first exit signal also
    arms the drain deadline (`on_drain_deadline`, after `drain_seconds`)."""

    on_drain_deadline: Callable[[], None] | None = None
    drain_seconds: float = 0.0
    _loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:  # uvicorn's signature
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.should_exit
        super().handle_exit(sig, frame)
        if first and self.on_drain_deadline is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.call_later, self.drain_seconds, self.on_drain_deadline)
        captured = getattr(self, "_captured_signals", None)
        if sig == signal.SIGTERM and captured and captured[-1] == sig:
            captured.pop()


def run(config: ServerConfig, log_level: str = "info") -> None:
    """Serves until SIGTERM/SIGINT (exit 0) or until an engine dies (exit 1, after a graceful stop
    that lets the open streams receive their error events)."""
    logging.getLogger("ortinf").setLevel(log_level.upper())
    if hasattr(sys.stdout, "reconfigure"):  # uvicorn's access log goes to stdout: a line as it happens, also into a file
        sys.stdout.reconfigure(line_buffering=True)
    app = build_app(config)
    server = _Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level=log_level,
        timeout_graceful_shutdown=config.shutdown_timeout, access_log=config.access_log, http=http_protocol(config.request_header_timeout),
    ))
    state = app.state.ortinf
    state.request_exit = lambda: setattr(server, "should_exit", True)  # uvicorn polls the flag
    server.drain_seconds = max(0.0, config.shutdown_timeout - min(DRAIN_MARGIN, config.shutdown_timeout / 2))
    server.on_drain_deadline = state.end_running_requests
    server.run()
    # Every client has had its answer: exit now, without waiting for threads no request needs any more (a media
    # fetch or an image decode of a request the drain deadline ended; Python's exit joins the pool threads)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if state.fatal_error is not None else 0)
