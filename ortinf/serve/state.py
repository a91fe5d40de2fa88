"""ServerState: what the app holds (config, models, metrics, admission); the config is ortinf/serve/config.py's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ortinf.serve.admission import Admission
from ortinf.serve.api.openai.responses_store import ResponseStore
from ortinf.serve.config import ServerConfig
from ortinf.serve.metrics import EngineMetrics
from ortinf.serve.models import ModelRegistry, ServedModel

if TYPE_CHECKING:
    from ortinf.serve.model_manager import ModelManager

log = logging.getLogger(__name__)


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
    models: ModelManager | None = None  # --models-dir's (ortinf/serve/model_manager.py), set by the app

    async def model(self, name: str | None, request) -> ServedModel:  # a starlette Request
        """The served model a request names: with --models-dir, loaded if it is not and leased to the request until its
        response has been sent; otherwise the registry's."""
        if self.models is None:
            return self.registry.get(name)
        return await self.models.use(name, request)

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
        self.admission.close(error)  # requests still preparing (a vision request decoding its images) end too
        for model in self.registry.models.values():
            if model.engine.num_unfinished:
                log.warning("drain time ran out: ending %d running request(s) of '%s'", model.engine.num_unfinished, model.name)
            model.engine.fail_all(error)  # also with none open: a beam search between two steps must not start its next

    def healthy(self) -> tuple[bool, str]:
        if self.load_error is not None:
            return False, f"the model failed to load: {self.load_error}"
        if not self.ready:
            return False, "the model is loading"
        for model in self.registry.models.values():
            if not model.engine.is_alive:
                return False, f"the engine of '{model.name}' has failed: {model.engine.error}"
        return True, "ok"
