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


class _Server(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM after its graceful shutdown, so the process dies by the
    signal (exit -15); a drained SIGTERM is a clean stop here, and exits 0. The first exit signal also
    arms the drain deadline (`on_drain_deadline`, after `drain_seconds`)."""

    on_drain_deadline: Callable[[], None] | None = None
    drain_seconds: float = 0.0
    _loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:  # noqa: ANN001 - uvicorn's signature
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
    app = build_app(config)
    server = _Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level=log_level,
        timeout_graceful_shutdown=config.shutdown_timeout, access_log=False,
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
