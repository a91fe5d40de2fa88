"""ServerState: what the app holds (config, models, metrics, admission) and ServerConfig."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ortinf.serve.metrics import EngineMetrics
from ortinf.serve.models import ModelRegistry
from ortinf.serve.streaming import Admission


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Every `ortinf serve` option; CLI flags, environment variables and the YAML file map onto it."""

    packages: tuple[Path, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    provider: str = "auto"
    served_model_names: tuple[str, ...] = ()
    api_key: str | None = None
    max_num_seqs: int = 64
    max_queued_requests: int = 256
    max_num_batched_tokens: int = 2048
    kv_cache_memory: int | None = None
    shutdown_timeout: float = 30.0
    max_body_size: int = 16 * 2**20
    intra_op_threads: int = 0
    debug_fail_after_steps: int | None = None


@dataclass(slots=True)
class ServerState:
    config: ServerConfig
    registry: ModelRegistry = field(default_factory=ModelRegistry)
    metrics: EngineMetrics = field(default_factory=EngineMetrics)
    admission: Admission | None = None
    ready: bool = False
    load_error: str | None = None

    def __post_init__(self) -> None:
        self.admission = Admission(self.config.max_num_seqs, self.config.max_queued_requests)

    def healthy(self) -> tuple[bool, str]:
        if self.load_error is not None:
            return False, f"the model failed to load: {self.load_error}"
        if not self.ready:
            return False, "the model is loading"
        for model in self.registry.models.values():
            if model.engine is not None and not model.engine.is_alive:
                return False, f"the engine of '{model.name}' has failed: {model.engine.error}"
        return True, "ok"
