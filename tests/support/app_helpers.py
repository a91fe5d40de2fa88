"""The server in this process: the real app (ortinf.serve.app.build_app) and its engines, with their lifespan, behind
Starlette's TestClient (an httpx.Client over an ASGI transport, no socket). The official SDKs are pointed at it through
that transport, so that protocol tests (OpenAI, Anthropic, Ollama, ...) run what a server process runs, minus the
process: no interpreter start, and coverage sees the routes. Real processes stay for signals, drain, slow clients,
restarts, sockets and the command line (tests/e2e/)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
from starlette.testclient import TestClient

from ortinf.serve.app import build_app
from ortinf.serve.state import ServerConfig

URL = "http://testserver"


@dataclass
class InProcessServer:
    http: TestClient  # requests by path: http.post("/v1/messages", json=...)
    url: str = URL

    @property
    def transport(self) -> httpx.BaseTransport:
        """A transport onto the app, for clients that build their own httpx.Client (ollama's)."""
        return ThroughTestClient(self.http)

    def openai(self, api_key: str = "unused"):
        import openai

        return openai.OpenAI(base_url=f"{URL}/v1", api_key=api_key, max_retries=0, http_client=self.http)

    def anthropic(self, api_key: str = "unused"):
        import anthropic

        return anthropic.Anthropic(base_url=URL, api_key=api_key, max_retries=0, http_client=self.http)

    def ollama(self):
        import ollama

        return ollama.Client(host=URL, transport=self.transport)


class ThroughTestClient(httpx.BaseTransport):
    """Sends an httpx.Client's requests through the TestClient (whose own transport answers only the TestClient's
    send); the body comes back whole, as the TestClient reads it."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.client.request(request.method, str(request.url), headers=dict(request.headers), content=request.read())
        headers = [(name, value) for name, value in answer.headers.multi_items() if name.lower() != "content-encoding"]
        return httpx.Response(answer.status_code, headers=headers, stream=httpx.ByteStream(answer.read()))


@contextlib.contextmanager
def serving(config: ServerConfig, timeout: float = 120.0) -> Iterator[InProcessServer]:
    """The app of `config` started (its lifespan run) and healthy; stopped on exit."""
    with TestClient(build_app(config), base_url=URL) as client:
        deadline = time.monotonic() + timeout
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the models did not load"
            time.sleep(0.05)
        yield InProcessServer(client)
