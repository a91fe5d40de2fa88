"""Running the app under uvicorn. SIGTERM: stop accepting, finish in-flight requests for up to
`shutdown_timeout` seconds, then exit 0 (uvicorn's graceful shutdown)."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

import uvicorn

from ortinf.serve.app import build_app
from ortinf.serve.state import ServerConfig


class _Server(uvicorn.Server):
    """uvicorn re-raises a captured SIGTERM after its graceful shutdown, so the process dies by the
    signal (exit -15); a drained SIGTERM is a clean stop here, and exits 0."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
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
    server.run()
    if state.fatal_error is not None:
        sys.exit(1)
