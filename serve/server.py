"""Running the app under uvicorn. SIGTERM: stop accepting, finish in-flight requests for up to
`shutdown_timeout` seconds, then exit 0 (uvicorn's graceful shutdown)."""

from __future__ import annotations

import logging

import uvicorn

from ortinf.serve.app import build_app
from ortinf.serve.state import ServerConfig


def run(config: ServerConfig, log_level: str = "info") -> None:
    logging.getLogger("ortinf").setLevel(log_level.upper())
    app = build_app(config)
    server = uvicorn.Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level=log_level,
        timeout_graceful_shutdown=config.shutdown_timeout, access_log=False,
    ))
    server.run()
