"""The front deployment of prefix routing (ortinf/serve/ray_routing.py): reads each body, keys it by its
prompt's beginning, and forwards it to the engine deployment, whose router picks the replica.

No `from __future__ import annotations` here, on purpose: Ray pickles the route by value to the
replica, where FastAPI must find the real `Request` class in the annotation, not a string to
resolve in globals that cloudpickle did not carry.
"""

from fastapi import FastAPI, Request
from starlette.responses import StreamingResponse

from ortinf.serve.config import ServerConfig
from ortinf.serve.ray_routing import routing_key

HOP_HEADERS = {b"content-length", b"transfer-encoding"}


def front_deployment(config: ServerConfig, name: str):
    """The front as a Ray Serve deployment (bind it to the engine deployment)."""
    from ray import serve

    app = FastAPI(title="ortinf (Ray, prefix routing)", docs_url=None, redoc_url=None, openapi_url=None)

    @serve.deployment(name=name, num_replicas=1, ray_actor_options={"num_cpus": 0},
                      max_ongoing_requests=10 * (config.max_num_seqs + config.max_queued_requests),
                      graceful_shutdown_timeout_s=config.shutdown_timeout)
    @serve.ingress(app)
    class Front:
        def __init__(self, engine_handle) -> None:
            self.engine = engine_handle.options(stream=True)

        @app.api_route("/{path:path}", methods=["GET", "POST", "HEAD", "PUT", "DELETE"])
        async def forward(self, path: str, request: Request):
            body = await request.body()
            key = routing_key(body) if request.method == "POST" else None
            stream = self.engine.handle_http.remote(key, request.method, "/" + path, request.url.query.encode(),
                                                    list(request.headers.raw), body)
            start = await stream.__anext__()
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start.get("headers", []) if k.lower() not in HOP_HEADERS}

            async def rest():
                async for message in stream:
                    if message.get("body"):
                        yield message["body"]

            return StreamingResponse(rest(), status_code=start["status"], headers=headers)

    return Front
