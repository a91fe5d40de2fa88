"""--api-key guards every route but /health, /version, /load, /metrics and the chat page at / (issue 41, finding 1:
/rerank, /v2/rerank, /score and /classify answered without the key). The walk takes the routes from the app
itself, so a route added later is walked too; the key comes as `Authorization: Bearer` or (Anthropic's clients)
`x-api-key`, and the refusal is in the shape of the API the path speaks."""

from __future__ import annotations

import re

import httpx
import pytest
from starlette.routing import Route
from support.server_helpers import running_server

from ortinf.serve.app import OPEN_PATHS, build_app
from ortinf.serve.state import ServerConfig

KEY = "sk-test-key"
DOCUMENTED_OPEN = {"/health", "/version", "/load", "/metrics", "/"}


def _walk(routes, prefix: str = ""):
    """Every Route under `routes`, through included routers (FastAPI wraps them) and mounts."""
    for route in routes:
        if isinstance(route, Route):
            yield prefix + route.path, route.methods or {"GET"}
        elif hasattr(route, "original_router"):  # FastAPI's included router
            yield from _walk(route.original_router.routes, prefix + route.include_context.prefix)
        elif hasattr(route, "routes"):  # a Mount
            yield from _walk(route.routes, prefix + getattr(route, "path", ""))
        else:
            raise AssertionError(f"a route of an unexpected kind: {route!r}")


def every_route() -> list[tuple[str, str]]:
    """(method, path) of every route the app can mount (the runtime LoRA routes included), path
    parameters filled in."""
    app = build_app(ServerConfig(packages=(), allow_runtime_lora_updates=True))
    walked = []
    for path, methods in _walk(app.routes):
        walked += [(method, re.sub(r"\{[^}]+\}", "some-id", path)) for method in sorted(methods)]
    return walked


@pytest.fixture(scope="module")
def keyed(minilm_package, tmp_path_factory):
    with running_server([str(minilm_package), "--served-model-name", "minilm", "--api-key", KEY],
                        tmp_path_factory.mktemp("logs")) as server:
        yield server


def test_the_open_paths_are_the_documented_ones():
    assert set(OPEN_PATHS) == DOCUMENTED_OPEN


def test_every_route_but_the_open_ones_needs_the_key(keyed):
    routes = every_route()
    paths = {path for _, path in routes}
    for expected in ("/rerank", "/v2/rerank", "/v1/rerank", "/score", "/classify", "/tokenize", "/detokenize",
                     "/v1/responses", "/v1/load_lora_adapter", "/openapi.json", "/v1/messages", "/api/chat", "/api/tags"):
        assert expected in paths, f"{expected} is not a route of the app: the walk would miss it"
    with httpx.Client(base_url=keyed.url, timeout=30) as client:
        for method, path in [*routes, ("GET", "/no-such-route"), ("POST", "/v1/no-such-route")]:
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}, {"x-api-key": "wrong"},
                            {"x-api-key": KEY, "authorization": f"Bearer {KEY}"}):
                answer = client.request(method, path, headers=headers, json={})
                if path in DOCUMENTED_OPEN:
                    assert answer.status_code != 401, (method, path)
                else:
                    assert answer.status_code == 401, (method, path, headers, answer.status_code, answer.text[:200])
                    if method == "HEAD":  # a HEAD answer has no body
                        continue
                    body = answer.json()
                    if path.startswith("/v1/messages"):  # Anthropic's shape
                        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
                    elif path.startswith("/api/"):  # Ollama's
                        assert set(body) == {"error"} and ("API key" in body["error"] or "credential" in body["error"])
                    else:
                        assert body["error"]["code"] == "invalid_api_key"
            with_key = client.request(method, path, headers={"authorization": f"Bearer {KEY}"}, json={})
            assert with_key.status_code != 401, (method, path)
        assert client.get("/v1/models", headers={"x-api-key": KEY}).status_code == 200


def test_rerank_runs_only_with_the_key(keyed):
    body = {"model": "minilm", "query": "the quick fox", "documents": ["a lazy dog", "the fox"]}
    for path in ("/rerank", "/v2/rerank", "/v1/rerank"):
        assert httpx.post(f"{keyed.url}{path}", json=body, timeout=30).status_code == 401
        answer = httpx.post(f"{keyed.url}{path}", json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["results"]) == 2
    score = {"model": "minilm", "text_1": "the quick fox", "text_2": "the fox"}
    assert httpx.post(f"{keyed.url}/score", json=score, timeout=30).status_code == 401
    assert httpx.post(f"{keyed.url}/score", json=score, headers={"authorization": f"Bearer {KEY}"}, timeout=30).status_code == 200


def test_two_authorization_headers_are_refused(keyed):
    """With two Authorization headers neither wins (the last one did: a proxy's header could be overridden)."""
    body = {"model": "minilm", "prompt": "hello"}
    for pair in ([f"Bearer {KEY}", "Bearer wrong"], ["Bearer wrong", f"Bearer {KEY}"], [f"Bearer {KEY}"] * 2):
        answer = httpx.post(f"{keyed.url}/tokenize", json=body, headers=[("authorization", value) for value in pair], timeout=30)
        assert answer.status_code == 401, (pair, answer.text)
        assert "send one credential" in answer.json()["error"]["message"]
    assert httpx.post(f"{keyed.url}/tokenize", json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=30).status_code == 200
