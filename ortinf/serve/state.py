"""ServerState: what the app holds (config, models, metrics, admission) and ServerConfig."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ortinf.serve.metrics import EngineMetrics
from ortinf.serve.models import ModelRegistry
from ortinf.serve.response_store import DEFAULT_CAPACITY, ResponseStore
from ortinf.serve.streaming import Admission

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Every `ortinf serve` option: the server's own below, the engine's in `engine_options` (EngineConfig's
    keyword arguments but package_dir, from the options generated off its fields: ortinf/config.py).
    CLI flags, environment variables and the YAML file map onto it."""

    packages: tuple[Path, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ()
    api_key: str | None = None
    max_queued_requests: int = 256
    shutdown_timeout: float = 30.0
    max_body_size: int = 2 * 2**20  # TGI's default; every route but the audio uploads
    max_audio_body_size: int = 26 * 2**20  # the audio routes' bodies: an upload (OpenAI's 25 MiB) and its form fields
    tool_call_parser: str = "auto"
    reasoning_parser: str = "none"  # or auto, qwen3, deepseek_r1, gpt_oss (ortinf/tasks/chat/reasoning.py)
    metrics_prefix: str = "ortinf"  # or "vllm": the names dashboards and cluster routers look for
    allow_runtime_lora_updates: bool = False  # /v1/load_lora_adapter and /v1/unload_lora_adapter
    limit_mm_per_prompt: int = 8  # images per conversation (vLLM's --limit-mm-per-prompt image=N)
    allowed_media_domains: tuple[str, ...] = ()  # hosts image URLs may be fetched from (none: data URLs only)
    media_fetch_timeout: float = 5.0
    responses_store_size: int = DEFAULT_CAPACITY  # bytes of stored Responses API responses (ortinf/serve/response_store.py)
    transcription_fallback: bool = True  # OpenAI's temperature 0: hotter retries, silent windows skipped (ortinf/tasks/speech/longform.py)
    engine_options: dict = field(default_factory=dict)  # EngineConfig's keyword arguments (but package_dir)

    def engine_setting(self, name: str):  # noqa: ANN201
        """An engine setting as the engines get it: given, or EngineConfig's default."""
        import dataclasses

        from ortinf.config import EngineConfig

        if name in self.engine_options:
            return self.engine_options[name]
        spec = next(f for f in dataclasses.fields(EngineConfig) if f.name == name)
        return spec.default_factory() if spec.default is dataclasses.MISSING else spec.default

    @property
    def media_policy(self):  # noqa: ANN201 - a MediaPolicy
        from ortinf.tasks.chat.media import MediaPolicy

        return MediaPolicy(max_images=self.limit_mm_per_prompt, allowed_domains=self.allowed_media_domains, fetch_timeout=self.media_fetch_timeout)

    @property
    def max_num_seqs(self) -> int:
        return self.engine_setting("max_num_seqs")


@dataclass(slots=True)
class ServerState:
    config: ServerConfig
    registry: ModelRegistry = field(default_factory=ModelRegistry)
    metrics: EngineMetrics = field(default_factory=EngineMetrics)
    admission: Admission | None = None
    responses: ResponseStore | None = None  # the Responses API's stored responses
    ready: bool = False
    load_error: str | None = None
    fatal_error: str | None = None  # an engine died: the process exits non-zero (ortinf/serve/server.py)
    request_exit: Callable[[], None] | None = None  # set by the server: begins a graceful stop

    def __post_init__(self) -> None:
        self.admission = Admission(self.config.max_num_seqs, self.config.max_queued_requests)
        self.metrics = EngineMetrics(self.config.metrics_prefix)
        self.responses = ResponseStore(self.config.responses_store_size)

    def fatal(self, what: str, exc: BaseException) -> None:
        """A model failed to load or its engine died (called from any thread): the server stops
        gracefully and exits 1, so a supervisor restarts it; one that stays up answering 503 or 500
        to everything helps nobody."""
        log.critical("%s (%s): the server stops and exits with status 1", what, exc)
        self.fatal_error = str(exc)
        if self.request_exit is not None:
            self.request_exit()

    def end_running_requests(self) -> None:
        """The drain deadline (ortinf/serve/server.py): every request still running ends now with a 503 error
        (streams: an error event, then [DONE]) instead of being cut off by uvicorn."""
        from ortinf.errors import ShuttingDownError

        error = ShuttingDownError(f"the server is shutting down and its drain time (--shutdown-timeout "
                                  f"{self.config.shutdown_timeout:g} s) ran out before this request finished; retry it")
        for model in self.registry.models.values():
            for engine in model.engines:
                if engine.num_unfinished:
                    log.warning("drain time ran out: ending %d running request(s) of '%s'", engine.num_unfinished, model.name)
                    engine.fail_all(error)

    def healthy(self) -> tuple[bool, str]:
        if self.load_error is not None:
            return False, f"the model failed to load: {self.load_error}"
        if not self.ready:
            return False, "the model is loading"
        for model in self.registry.models.values():
            for engine in model.engines:
                if not engine.is_alive:
                    return False, f"the engine of '{model.name}' has failed: {engine.error}"
        return True, "ok"
