"""Models loaded on demand (`ortinf serve --models-dir DIR`), as Ollama and llama-server's router do.

Every package, Hugging Face folder and GGUF file directly under DIR is listed (/v1/models, /api/tags) without loading.
A request names one: it loads then (a Hugging Face folder or a GGUF is exported first, once, into DIR/.ortinf/), and
requests that come while it loads wait for the same load, each at most --model-load-timeout seconds (a 503 that says
it is still loading; the load goes on). At most --max-loaded-models are loaded, within --models-memory: to make room
the least recently used idle model is unloaded (one with no request in flight: a request holds a lease on its model
from the moment the route resolves it until its response, streamed or not, has been sent). A model idle for
--idle-unload seconds is unloaded too, or as Ollama's keep_alive of its last request says. Loads and unloads run in
worker threads: the models already loaded go on serving. A package that fails to load is an error for its own
requests (500, with the reason), retried by a request after RETRY_AFTER seconds.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from starlette.requests import Request

from ortinf.config import available_memory, proc_bytes
from ortinf.serve.errors import APIError
from ortinf.serve.models import ServedModel

log = logging.getLogger(__name__)

RETRY_AFTER = 30.0  # seconds before a model that failed to load is tried again
EXPORTS = ".ortinf"  # DIR/.ortinf/NAME: the package exported from a Hugging Face folder or a GGUF under DIR
LEASES = "ortinf_leases"  # the request scope's list of the models it holds


@dataclass(slots=True)
class Entry:
    """A model under --models-dir: its name (the folder's or the GGUF's stem), its source and its package."""

    name: str
    source: Path
    kind: str  # "package", "hf" or "gguf"

    @property
    def package(self) -> Path:
        return self.source if self.kind == "package" else self.source.parent / EXPORTS / self.name

    def size(self) -> int:
        """Bytes of its package (of its source before it is exported)."""
        where = self.package if self.package.exists() else self.source
        files = [where] if where.is_file() else where.rglob("*")
        return sum(p.stat().st_size for p in files if p.is_file())

    def describe(self) -> dict:
        """What /v1/models shows of it before it loads: its task and context length where the package says."""
        manifest = self.package / "ortinf.json"
        try:
            data = json.loads(manifest.read_text()) if manifest.is_file() else {}
        except (OSError, ValueError):
            data = {}
        spec = data.get("decoder") or data.get("encoder") or {}
        task = data.get("task") or ("text-generation" if self.kind == "gguf" else "unknown")
        return {"task": task, "max_model_len": int(spec.get("max_model_len") or 0), "model_type": data.get("model_type", ""),
                "dtype": data.get("dtype", "")}


def discover(folder: Path) -> dict[str, Entry]:
    """The models directly under `folder`: packages (ortinf.json), Hugging Face folders (config.json), GGUF files."""
    if not folder.is_dir():
        raise APIError(400, f"--models-dir {folder}: no such folder")
    found: dict[str, Entry] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        if path.is_dir() and (path / "ortinf.json").is_file():
            found[path.name] = Entry(path.name, path, "package")
        elif path.is_dir() and (path / "config.json").is_file():
            found[path.name] = Entry(path.name, path, "hf")
        elif path.is_file() and path.suffix.lower() == ".gguf":
            found[path.stem] = Entry(path.stem, path, "gguf")
    return found


@dataclass(slots=True)
class Slot:
    """A loaded model's bookkeeping."""

    users: int = 0  # requests holding it
    last_used: float = field(default_factory=time.monotonic)
    keep_alive: float | None = None  # its last request's keep_alive (seconds after it; inf: forever; None: --idle-unload)
    keep_until: float | None = None  # set from keep_alive when it becomes idle: unload once idle past this
    footprint: int = 0  # resident memory it added when it loaded (bytes)


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 elsewhere)."""
    return proc_bytes("/proc/self/status", "VmRSS") or 0


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def keep_large_allocations_mapped() -> None:
    """Fixes glibc's mmap threshold at its default (128 KiB). Left dynamic, it rises to the size of the first large block
    freed, so a model loaded after an unload gets its weights and buffers from the heap, where freeing them leaves the
    pages resident (measured: the second unload of a model returned nothing, the first 34 MB); mapped, they go back to
    the system when freed."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    except (OSError, AttributeError):
        pass


def _trim() -> None:
    """Gives freed heap pages back to the system (glibc keeps them otherwise: an unloaded model's memory would stay
    resident)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


LOAD_WAIT = "ortinf_load_seconds"  # request state: the seconds a request waited for its model to load


def load_wait(request: Request) -> float:
    """The seconds `request` waited for its model to load (0 when it was loaded already): Ollama's load_duration."""
    return float(request.scope.get("state", {}).get(LOAD_WAIT, 0.0))


class ModelManager:
    """Loads, leases and unloads the --models-dir models of a server (ServerState.models)."""

    def __init__(self, state, loader: Callable[[Path, str], ServedModel]) -> None:  # noqa: ANN001 - the ServerState
        config = state.config
        self.state, self.loader = state, loader
        self.catalog = discover(Path(config.models_dir)) if config.models_dir is not None else {}
        self.slots: dict[str, Slot] = {}
        self.loading: dict[str, asyncio.Future] = {}
        self.failed: dict[str, tuple[float, str]] = {}
        self.footprints: dict[str, int] = {}  # what each model took when it last loaded (bytes resident)
        self.room = asyncio.Lock()  # one load at a time: each decides room with the others' memory known
        self.idle = asyncio.Event()  # set whenever a model becomes idle or unloads
        self.budget = config.models_memory or int(available_memory() * 0.9)
        if self.catalog:
            keep_large_allocations_mapped()
        self.loads = self.unloads = 0

    # -- requests --------------------------------------------------------------------------------------

    async def use(self, name: str | None, request: Request) -> ServedModel:
        """The model `name` names, loaded if it is not, leased to `request` until its response has been sent."""
        registry = self.state.registry
        entry = self.catalog.get(name) if name is not None else None
        if entry is None or name in registry.models:
            model = registry.get(name)
        else:
            started = time.monotonic()
            await self._loaded(entry)
            request.scope.setdefault("state", {})[LOAD_WAIT] = time.monotonic() - started
            model = registry.get(name)
        slot = self.slots.get(model.parent or model.name)
        if slot is not None:  # a --models-dir model: leased (no await between finding it and counting the lease)
            slot.users += 1
            request.scope.setdefault("state", {}).setdefault(LEASES, []).append(model.parent or model.name)
        return model

    def release(self, name: str) -> None:
        slot = self.slots.get(name)
        if slot is not None:
            slot.users -= 1
            slot.last_used = time.monotonic()
            if slot.users == 0:
                slot.keep_until = None if slot.keep_alive is None else slot.last_used + slot.keep_alive
                self.idle.set()

    def keep_alive(self, name: str, seconds: float) -> None:
        """Ollama's keep_alive of a request on a model: once the model is idle, unload it after this many seconds (inf:
        never; 0: at once), instead of after --idle-unload."""
        slot = self.slots.get(name)
        if slot is not None:
            slot.keep_alive = max(seconds, 0.0)

    def expires(self, name: str) -> float | None:
        """When an idle model would unload (time.time()), None when never."""
        slot = self.slots.get(name)
        if slot is None:
            return None
        idle_unload = self.state.config.idle_unload
        at = slot.last_used + slot.keep_alive if slot.keep_alive is not None else slot.last_used + idle_unload if idle_unload else None
        return None if at is None or at == float("inf") else time.time() + (at - time.monotonic())

    # -- loading ---------------------------------------------------------------------------------------

    async def _loaded(self, entry: Entry) -> None:
        failed = self.failed.get(entry.name)
        if failed is not None and time.monotonic() - failed[0] < RETRY_AFTER:
            raise APIError(500, f"model '{entry.name}' could not be loaded: {failed[1]}", param="model", code="model_load_failed")
        future = self.loading.get(entry.name)
        if future is None:
            future = self.loading[entry.name] = asyncio.ensure_future(self._load(entry))
            future.add_done_callback(lambda _: self.loading.pop(entry.name, None))
        timeout = self.state.config.model_load_timeout
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            raise APIError(503, f"model '{entry.name}' is still loading after {timeout:g} s (--model-load-timeout): retry shortly",
                           param="model", code="model_loading", headers={"Retry-After": "5"}) from None

    async def _load(self, entry: Entry) -> None:
        try:
            async with self.room:
                await self._make_room(entry)
                before = resident_bytes()
                model = await asyncio.to_thread(self._open, entry)
                self.slots[entry.name] = Slot(footprint=max(resident_bytes() - before, 0))
                self.footprints[entry.name] = self.slots[entry.name].footprint
                self.state.registry.add(model)
                self.loads += 1
                self.state.metrics.model_loaded(entry.name, True)
                log.info("'%s' takes %.2f GB of this process's resident memory", entry.name, self.slots[entry.name].footprint / 1e9)
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - this model's requests get it; the others go on
            message = str(exc).splitlines()[0][:240] if str(exc) else type(exc).__name__
            self.failed[entry.name] = (time.monotonic(), message)
            log.error("model '%s' failed to load: %s", entry.name, message)
            raise APIError(500, f"model '{entry.name}' could not be loaded: {message}", param="model", code="model_load_failed") from exc
        self.failed.pop(entry.name, None)

    def _open(self, entry: Entry) -> ServedModel:
        """Exports a Hugging Face folder or a GGUF once (into DIR/.ortinf/NAME), then loads the package (worker thread)."""
        package = entry.package
        if entry.kind != "package" and not (package / "ortinf.json").is_file():
            import ortinf

            log.info("exporting '%s' from %s into %s (once)", entry.name, entry.source, package)
            ortinf.export(entry.source, package, progress=False)
        model = self.loader(package, entry.name)
        for engine in model.engines:  # its footprint is measured next: a large KV pool's pages mapped first
            resident = getattr(engine.engine, "wait_until_resident", None)
            if resident is not None:
                resident()
        return model

    def _cost(self, entry: Entry) -> int:
        """The memory a model is expected to take: what it took when it last loaded, else its package's size."""
        return self.footprints.get(entry.name) or entry.size()

    async def _make_room(self, entry: Entry) -> None:
        """Unloads least recently used idle models until one more fits --max-loaded-models and --models-memory; waits
        (within --model-load-timeout) while every loaded model is busy."""
        config = self.state.config
        deadline = time.monotonic() + config.model_load_timeout
        while True:
            loaded = list(self.slots)
            over_count = config.max_loaded_models and len(loaded) >= config.max_loaded_models
            used = sum(self.slots[name].footprint for name in loaded)
            over_memory = loaded and used + self._cost(entry) > self.budget
            if not over_count and not over_memory:
                return
            idle = sorted((slot.last_used, name) for name, slot in self.slots.items() if slot.users == 0)
            if idle:
                await self.unload(idle[0][1])
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise APIError(503, f"every loaded model is busy ({len(loaded)} of --max-loaded-models {config.max_loaded_models or '-'}, "
                                    f"{used / 1e9:.1f} of {self.budget / 1e9:.1f} GB --models-memory): retry shortly",
                               param="model", code="models_busy", headers={"Retry-After": "5"})
            self.idle.clear()
            try:
                await asyncio.wait_for(self.idle.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def unload(self, name: str) -> None:
        """Takes an idle model out of service (no new request finds it), then stops its engines (worker thread)."""
        model = self.state.registry.models.pop(name, None)
        self.slots.pop(name, None)
        if model is None:
            return
        self.unloads += 1
        self.state.metrics.model_loaded(name, False)

        def stop() -> None:
            for engine in model.engines:
                engine.shutdown(timeout=5.0)
            model.engine = model.pooler = model.pooling = model.chat = model.transcriber = None
            _trim()  # its sessions and KV pool are garbage now: their pages go back to the system

        await asyncio.to_thread(stop)
        self.idle.set()
        log.info("unloaded '%s'", name)

    async def watch(self) -> None:
        """Unloads models idle past --idle-unload, or past their last request's keep_alive (runs for the server's life)."""
        idle_unload = self.state.config.idle_unload
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for name, slot in list(self.slots.items()):
                if slot.users:
                    continue
                limit = slot.keep_until if slot.keep_until is not None else (slot.last_used + idle_unload if idle_unload else None)
                if limit is not None and now >= limit and not self.room.locked():
                    await self.unload(name)

    # -- what is listed --------------------------------------------------------------------------------

    def unloaded(self) -> list[Entry]:
        return [entry for name, entry in self.catalog.items() if name not in self.state.registry.models]

    def is_loaded(self, name: str) -> bool:
        return name in self.state.registry.models


class Leases:
    """Pure ASGI middleware: the models a request leased (ModelManager.use) are released once its response has been
    sent (a stream's last byte included: the app's call returns only then)."""

    def __init__(self, app, state) -> None:  # noqa: ANN001
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        if scope["type"] != "http" or self.state.models is None:
            return await self.app(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            for name in (scope.get("state") or {}).get(LEASES, ()):
                self.state.models.release(name)


__all__ = ["Entry", "Leases", "ModelManager", "discover"]
