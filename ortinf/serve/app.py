"""The FastAPI app: middleware (body size, API key), routes, and background model loading."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib
import logging
import time
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import ortinf
from ortinf import extras
from ortinf.errors import ConfigError
from ortinf.manifest import Manifest
from ortinf.serve import preload
from ortinf.serve.api import front_ends
from ortinf.serve.api.openai import schemas
from ortinf.serve.config import ServerConfig, engine_options, model_names
from ortinf.serve.errors import error_body, error_response, from_exception, install_error_handlers, respond
from ortinf.serve.model_manager import Leases, ModelManager, resident_bytes
from ortinf.serve.models import ServedModel
from ortinf.serve.page import PAGE_FILES, add_page_routes
from ortinf.serve.state import ServerState
from ortinf.tasks.kinds import PoolingTask, SpeechTask, TextTask
from ortinf.tasks.package import open_package

log = logging.getLogger(__name__)


def _has_vision(package: Path) -> bool:
    try:
        return Manifest.load(package).vision is not None
    except ConfigError:  # reported where the package is loaded
        return False


class BodyLimit:
    """Pure ASGI middleware: a body over `limit` bytes gets 413 before any route sees it.

    The body is read here (bounded by the limit) and replayed to the app.
    """

    def __init__(self, app: ASGIApp, limit: int, audio_limit: int, media_paths: tuple[str, ...] = ()) -> None:
        # media_paths: the routes that carry images inline (base64) when a vision-language model is served: bound
        # by the audio routes' limit, since a photo's data URL alone passes the JSON routes' 2 MiB
        self.app, self.limit, self.audio_limit, self.media_paths = app, limit, audio_limit, media_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        path = scope["path"]
        limit = self.audio_limit if path.startswith("/v1/audio/") or path in self.media_paths else self.limit  # each bound by its own option
        too_large = error_response(413, f"the request body is larger than {limit} bytes", path=path)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await too_large(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return await too_large(scope, receive, send)
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class CatchAll:
    """Pure ASGI middleware, innermost of ours: an exception no handler took becomes the 500 answer
    here. Starlette's own catch-all (ServerErrorMiddleware) sends that answer and then re-raises, and
    uvicorn then drops the keep-alive connection without `Connection: close`, so a client's next
    request on it failed with a reset. A response already started (a stream) cannot be replaced:
    that exception goes on up (the routes turn stream failures into error events themselves)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # every error leaves as an OpenAI-shaped answer
            if started:
                raise
            await respond(from_exception(exc), scope["path"])(scope, receive, send)


class ClientGone:
    """Pure ASGI middleware, outermost of ours: an answer that cannot be written because the client
    closed the connection is nobody's error. uvicorn's httptools protocol marks only the last parsed
    request of a connection as disconnected, so a pipelined request queued behind it runs on and its
    write to the closed transport raises (uvloop); uncaught, that logged an "unexpected error" and
    uvicorn's "Exception in ASGI application". Here the failed write ends the request quietly, and
    the request's cycle is marked disconnected, as uvicorn would have had it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        gone = False

        async def guarded(message: Message) -> None:
            nonlocal gone
            try:
                await send(message)
            except (OSError, RuntimeError):
                gone = True
                raise

        try:
            await self.app(scope, receive, guarded)
        except Exception as exc:
            if not gone:
                raise
            log.debug("the client closed the connection before its answer was written (%s)", exc)
            cycle = getattr(receive, "__self__", None)  # uvicorn's RequestResponseCycle, when it is that server
            if hasattr(cycle, "disconnected"):
                cycle.disconnected = True


# what a supervisor, router or scraper reads, and the chat page (it holds no data: its calls carry the key)
OPEN_PATHS = frozenset({"/health", "/version", "/load", "/metrics", "/"})


class Gate:
    """Pure ASGI middleware (BaseHTTPMiddleware would hide client disconnects from the routes): with
    --api-key, every path but OPEN_PATHS needs the key, compared in constant time, and those paths
    answer 503 while the models load.

    The rule is by exclusion, not by prefix: every route that runs a model or reads served state sits
    behind the key, including the ones outside /v1 (/rerank, /score, /classify, /tokenize, the docs)
    and any route added later; a path that matches no route gets 401 before 404, so the routes are
    not listed to a client without the key (tests/e2e/test_api_key.py walks every route of the app)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state
        key = state.config.api_key
        # OpenAI's clients send `Authorization: Bearer KEY`, Anthropic's `x-api-key: KEY`: either, once
        self.expected = {b"authorization": f"Bearer {key}".encode(), b"x-api-key": key.encode()} if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and scope["path"] not in PAGE_FILES:  # the page's own files
            path = scope["path"]
            if self.expected is not None:
                given = [(name, value) for name, value in scope.get("headers") or [] if name in self.expected]
                if len(given) != 1 or not hmac.compare_digest(given[0][1], self.expected[given[0][0]]):  # two: neither wins
                    message = ("send one credential (an Authorization or an x-api-key header), not several" if len(given) > 1 else
                               "missing or wrong API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)")
                    # x-should-retry: the Anthropic and OpenAI SDKs retry a 401 unless told not to (Claude Code: 7 times in 45 s)
                    response = error_response(401, message, code="invalid_api_key", path=path, headers={"x-should-retry": "false"},
                                              wording={"anthropic": "invalid x-api-key"} if len(given) < 2 else None)
                    return await response(scope, receive, send)
            if not self.state.ready:
                response = error_response(503, "the model is loading; retry shortly", code="model_loading", headers={"Retry-After": "1"},
                                          path=path)
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


def load_model(package: Path, name: str, config: ServerConfig, state: ServerState, lora_base: bool = False) -> ServedModel:
    """Builds one served model (blocking: runs in a worker thread) and warms it up. `lora_base`: the
    model that serves --lora-modules (and runtime loads); the others get no LoRA slots."""
    manifest = Manifest.load(package)
    lacking = extras.needs("vision", f"reading images with {name}") if manifest.vision is not None else None
    if lacking:  # served text-only, as `ortinf generate` runs it: a request with images gets this line as its 400
        log.warning("%s; until then it serves text only", lacking)
    if manifest.speech is not None:
        lacking = extras.needs("audio", f"serving {name} (a speech-recognition model)")
        if lacking:
            raise ConfigError(lacking)
    options = engine_options(package, config, lora_base and manifest.speech is None)
    started, resident = time.perf_counter(), resident_bytes()
    preloaded = preload.take(package, name, options)  # opened while the server's modules imported (serve/preload.py)
    if preloaded is not None:
        task, started, resident = preloaded
    else:
        task = open_package(package, options, explicit=False, warm_up=True, name=name)
    if isinstance(task, SpeechTask) and task.transcriber.tokenizer is None:
        raise ConfigError(f"{name} has no tokenizer.json: the audio routes answer with text; re-export it from a folder "
                          "with the Whisper tokenizer")
    which = "the encoder engine" if isinstance(task, PoolingTask) else "the engine"
    model = ServedModel.start(name, task, config, on_step=state.metrics.hook(name),
                              on_dead=lambda exc: state.fatal(f"{which} of '{name}' died", exc))
    model.load_seconds = time.perf_counter() - started
    log.info("loaded '%s' in %.2f s: %s of weights in the package, %s more resident in this process", name,
             model.load_seconds, _gigabytes(weight_bytes(package)), _gigabytes(max(resident_bytes() - resident, 0)))
    return model


def weight_bytes(package: Path) -> int:
    """The bytes of a package's weight files (*.onnx.data): what loading maps or reads."""
    return sum(path.stat().st_size for path in package.rglob("*.onnx.data"))


def _gigabytes(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e8 else f"{count / 1e6:.1f} MB"


async def _load_all(state: ServerState) -> None:
    config = state.config
    try:
        packages = list(zip(config.packages, model_names(config)))
        lora_modules = config.engine_setting("lora_modules")
        wants_lora = bool(lora_modules or config.engine_options.get("max_loras") or config.allow_runtime_lora_updates)
        base = next((name for package, name in packages if Manifest.load(package).decoder is not None), None) if wants_lora else None
        if wants_lora and base is None:
            raise ConfigError("LoRA adapters need a text-generation package (exported with --enable-lora)")
        for package, name in packages:
            state.registry.add(await asyncio.to_thread(load_model, package, name, config, state, name == base))
        for adapter in lora_modules:
            state.registry.add_lora(adapter, base)
        state.ready = True
        served = [*state.registry.models, *([state.models.summary()] if state.models is not None else [])]
        log.info("ready: serving %s on http://%s:%d", " and ".join(served), config.host, config.port)
    except Exception as exc:  # noqa: BLE001 - reported by /health and the log, then the process exits 1
        state.load_error = str(exc)
        log.error("loading failed: %s", exc)
        state.fatal("loading failed", exc)  # a server that can never serve stops, visibly, instead of answering 503 forever


def build_app(config: ServerConfig, load_in_background: bool = True) -> FastAPI:
    """The app for `config`; models load in the background while /health answers 503, or (for a Ray
    replica, which must be ready when its start-up ends) before start-up completes."""
    state = ServerState(config)
    if config.models_dir is not None:  # models listed now, loaded on their first request (ortinf/serve/model_manager.py)
        state.models = ModelManager(state, lambda package, name: load_model(package, name, config, state))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if not load_in_background:
            await _load_all(state)
            if state.load_error is not None:
                raise RuntimeError(f"loading failed: {state.load_error}")
        loader = asyncio.create_task(_load_all(state)) if load_in_background else None
        watcher = asyncio.create_task(state.models.watch()) if state.models is not None else None
        yield
        for task in (loader, watcher):
            if task is not None:
                task.cancel()
        for model in state.registry.models.values():
            model.engine.shutdown(timeout=1.0)  # a step still running (a long prefill) is not waited for past a second:
            # its thread is a daemon, and every client has had its answer

    app = FastAPI(title="ortinf", version=ortinf.__version__, lifespan=lifespan,
                  description="OpenAI-compatible API over ONNX Runtime with a paged KV cache.")
    app.state.ortinf = state
    install_error_handlers(app)
    for front in front_ends():  # each API front-end's routes (ortinf/serve/api)
        for module in front.routes(config):
            app.include_router(importlib.import_module(module).router)

    # the last added runs first: the API key is checked before a byte of the body is read
    app.add_middleware(Leases, state=state)
    app.add_middleware(CatchAll)
    listed = [entry.package for entry in state.models.catalog.values()] if state.models is not None else []
    vision = any(_has_vision(package) for package in [*config.packages, *listed])
    app.add_middleware(BodyLimit, limit=config.max_body_size, audio_limit=config.max_audio_body_size,
                       media_paths=tuple(path for front in front_ends() for path in front.media_paths) if vision else ())
    app.add_middleware(Gate, state=state)
    app.add_middleware(ClientGone)

    def card(m: ServedModel) -> schemas.ModelCard:
        facts = m.task.card()
        root = m.task.lora_path(m.lora_name) if m.lora_name is not None and isinstance(m.task, TextTask) else None
        return schemas.ModelCard(id=m.name, created=m.created, task=facts.task, max_model_len=facts.max_model_len, root=root,
                                   parent=m.parent, input_modalities=list(facts.modalities))

    def unloaded_card(entry) -> schemas.ModelCard:  # a --models-dir model not loaded now
        facts = entry.read()  # as surveyed (models_folder.py): no disk access here; `error` marks one that cannot serve
        return schemas.ModelCard(id=entry.name, created=int(facts.modified), task=facts.task, max_model_len=facts.max_model_len,
                                   loaded=False, error=facts.error)

    @app.get("/v1/models", response_model=schemas.ModelList)
    async def list_models():
        cards = [card(m) for m in (*state.registry.models.values(), *state.registry.adapters())]
        if state.models is not None:
            cards += [unloaded_card(entry) for entry in await state.models.listed()]
        return schemas.ModelList(data=sorted(cards, key=lambda c: c.id))

    @app.get("/v1/models/{model_id:path}", response_model=schemas.ModelCard)
    async def retrieve_model(model_id: str):
        entry = next((e for e in await state.models.listed() if e.name == model_id), None) if state.models is not None else None
        if entry is not None:
            return unloaded_card(entry)
        return card(state.registry.get(model_id))

    add_page_routes(app)  # / and the page's files under /static/

    @app.get("/health")
    async def health():
        ok, message = state.healthy()
        if ok:
            return {"status": "ok"}
        return JSONResponse(error_body(503, message, code="unhealthy"), status_code=503)

    @app.get("/load")
    async def load():
        """vLLM's server-load endpoint: requests admitted and not yet finished (running, queued or
        being tokenised), what a load-aware router compares across replicas."""
        return {"server_load": state.admission.in_flight}

    @app.get("/version")
    async def version():
        return {"version": ortinf.__version__}

    @app.get("/metrics")
    async def metrics():
        state.metrics.admitted.set(state.admission.in_flight)
        if state.models is not None:
            state.metrics.models_loaded.set(len(state.models.slots))
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    return app
