"""ortinf on Ray Serve: the same FastAPI app as `ortinf serve`, one engine per replica, behind Ray's
HTTP proxy (`ortinf serve PKG --ray`, or `application()` from Python for `serve.run`).

Each replica builds its own app (the ingress builder runs on the replica) and loads its models
before its start-up ends, so Ray routes nothing to a replica that is still loading. Ray's health
check asks the app (`ServerState.healthy`): a replica whose engine died is replaced. Scale-down and
`serve.shutdown` drain a replica for `--shutdown-timeout` seconds (Ray's graceful shutdown), the
same promise SIGTERM makes to a single process. Ray is an optional extra (`pip install 'ortinf[ray]'`);
nothing else imports this module.

Why not `ray.serve.llm` (LLMConfig, `LLMServer`, its PrefixCacheAffinityRouter): see docs/scaling.md.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass

from ortinf.errors import ConfigError
from ortinf.serve.app import build_app
from ortinf.serve.config import ServerConfig

log = logging.getLogger(__name__)
DEPLOYMENT = "ortinf"


@dataclass(frozen=True, slots=True)
class RayOptions:
    """Replicas and their resources. With min_replicas/max_replicas, Ray autoscales on requests in flight."""

    num_replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    prefix_routing: bool = False  # a front deployment keys requests by prompt prefix (ortinf/serve/ray_routing.py)
    imbalanced_threshold: int = 8

    def __post_init__(self) -> None:
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ConfigError("autoscaling needs both --min-replicas and --max-replicas")
        if self.min_replicas is not None and self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ConfigError(f"--min-replicas ({self.min_replicas}) must not exceed --max-replicas ({self.max_replicas})")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None


def _import_serve():
    try:
        from ray import serve
    except ImportError as exc:
        raise ConfigError("--ray needs Ray Serve: pip install 'ortinf[ray]'") from exc
    return serve


class _ReplicaBase:
    """Ray's health check and forwarded requests, over the replica's app (`self.app`: Ray's ASGI
    wrapper's property for an ingress replica, an attribute for an EngineReplica)."""

    async def check_health(self) -> None:
        ok, message = self.app.state.ortinf.healthy()
        if not ok:
            raise RuntimeError(message)

    async def handle_http(self, key: str | None, method: str, path: str, query: bytes, headers: list, body: bytes):
        """A request forwarded by the prefix-routing front (`key` is for the router), run through this
        replica's app; yields the ASGI response messages."""
        from ortinf.serve.ray_routing import run_asgi

        async for message in run_asgi(self.app, method, path, query, headers, body):
            yield message


class OrtinfReplica(_ReplicaBase):
    """One replica behind Ray's HTTP proxy: the ingress app is built on the replica (Ray's ASGI
    wrapper sets `app` and runs its start-up and shutdown)."""


class EngineReplica(_ReplicaBase):
    """One replica behind the prefix-routing front: not an ingress (Ray takes one FastAPI ingress per
    application), so it builds its app and runs the app's start-up and shutdown itself."""

    async def __init__(self, config: ServerConfig) -> None:
        import uvicorn
        from uvicorn.lifespan.on import LifespanOn

        self.app = build_app(config, load_in_background=False)
        self._lifespan = LifespanOn(uvicorn.Config(self.app, lifespan="on", log_config=None, access_log=False))
        await self._lifespan.startup()
        if self._lifespan.should_exit:
            raise RuntimeError("the replica's models failed to load (see its log)")

    async def __del__(self) -> None:
        if hasattr(self, "_lifespan"):
            await self._lifespan.shutdown()  # engines stop


def application(config: ServerConfig, options: RayOptions | None = None):
    """The Ray Serve application for `config` (pass it to `serve.run`)."""
    serve = _import_serve()
    options = options or RayOptions()

    def build():  # runs on each replica: its own state, its own engines
        return build_app(config, load_in_background=False)

    settings = dict(
        name=f"{DEPLOYMENT}-engine" if options.prefix_routing else DEPLOYMENT,
        ray_actor_options={"num_cpus": options.cpus_per_replica, "num_gpus": options.gpus_per_replica},
        max_ongoing_requests=config.max_num_seqs + config.max_queued_requests,  # beyond it the app answers 429 itself
        graceful_shutdown_timeout_s=config.shutdown_timeout,
        health_check_period_s=5,
    )
    if options.autoscaling:
        settings["autoscaling_config"] = {
            "min_replicas": options.min_replicas, "max_replicas": options.max_replicas,
            "target_ongoing_requests": options.target_ongoing_requests or max(1.0, config.max_num_seqs / 2),
            # react within seconds (Ray's defaults look back 30 s): an engine's queue fills fast
            "metrics_interval_s": 2, "look_back_period_s": 6, "upscale_delay_s": 3, "downscale_delay_s": 15,
        }
    else:
        settings["num_replicas"] = options.num_replicas
    if options.prefix_routing:
        from ray.serve.config import RequestRouterConfig

        from ortinf.serve.ray_front import front_deployment
        from ortinf.serve.ray_routing import PrefixAffinityRouter

        settings["request_router_config"] = RequestRouterConfig(
            request_router_class=PrefixAffinityRouter, request_router_kwargs={"imbalanced_threshold": options.imbalanced_threshold})
        return front_deployment(config, DEPLOYMENT).bind(serve.deployment(**settings)(EngineReplica).bind(config))
    return serve.deployment(**settings)(serve.ingress(build)(OrtinfReplica)).bind()


def run_on_ray(config: ServerConfig, options: RayOptions, log_level: str = "info") -> None:
    """Starts (or joins, with RAY_ADDRESS) a Ray cluster, serves on config.host:config.port through
    Ray's proxy, and blocks until SIGTERM/SIGINT, then drains the replicas and stops."""
    serve = _import_serve()
    import ray

    logging.getLogger("ortinf").setLevel(log_level.upper())
    ray.init(include_dashboard=False, logging_level=log_level.upper(), ignore_reinit_error=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, which installs handlers of its own
        signal.signal(sig, lambda *_: stop.set())
    serve.start(http_options={"host": config.host, "port": config.port})
    serve.run(application(config, options), name=DEPLOYMENT, route_prefix="/")
    log.info("serving on Ray: http://%s:%d (%s)", config.host, config.port,
             f"{options.min_replicas}-{options.max_replicas} replicas" if options.autoscaling else f"{options.num_replicas} replicas")
    stop.wait()
    serve.shutdown()  # each replica drains for graceful_shutdown_timeout_s
    ray.shutdown()
