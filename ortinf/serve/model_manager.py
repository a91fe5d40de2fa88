"""Models loaded on demand (`ortinf serve --models-dir DIR`), as Ollama and llama-server's router do.

Every package, Hugging Face folder and GGUF file directly under DIR is listed (/v1/models, /api/tags) without loading
(models_folder.py: what is there, surveyed off the event loop; a broken or removed one is marked, its requests alone get
its error). A request names one (`model` is required here): it loads then, and requests that come while it loads wait
for the same load, each at most --model-load-timeout seconds (a 503 that says it is still loading; the load goes on); a
loaded model is theirs until they lease it. A Hugging Face folder or a GGUF is exported first, once, into DIR/.ortinf/,
in a child process, its requests answered 503 with Retry-After meanwhile. At most --max-loaded-models are loaded, within
--models-memory: to make room the least recently used idle model is unloaded (one with no request in flight or waiting:
a request holds a lease on its model from the moment the route resolves it until its response, streamed or not, has
been sent). A model idle for --idle-unload seconds is unloaded too, or as Ollama's keep_alive of its last request says.
Loads and unloads run in worker threads: the models already loaded go on serving. A package that fails to load is an
error for its own requests (500, with the reason), retried by a request after RETRY_AFTER seconds.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from starlette.requests import Request

from ortinf.config import available_memory, proc_bytes
from ortinf.serve.errors import APIError
from ortinf.serve.models import ServedModel
from ortinf.serve.models_folder import EXPORTS, Entry, ModelsFolder, discover, export_in_child

log = logging.getLogger(__name__)

RETRY_AFTER = 30.0  # seconds before a model that failed to load is tried again
LEASES = "ortinf_leases"  # the request scope's list of the models it holds


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

    def __init__(self, state, loader: Callable[[Path, str], ServedModel]) -> None:  # the ServerState
        config = state.config
        self.state, self.loader = state, loader
        self.folder = ModelsFolder(Path(config.models_dir)) if config.models_dir is not None else None
        self.slots: dict[str, Slot] = {}
        self.loading: dict[str, asyncio.Future] = {}
        self.waiting: dict[str, int] = {}  # requests waiting for a model's load: it is theirs until they lease it
        self.exporting: dict[str, tuple[float, asyncio.Future]] = {}  # exports running (or queued), with when they began
        self.exports = asyncio.Semaphore(1)  # one export child at a time: each holds a whole model (and torch) in memory
        self.failed: dict[str, tuple[float, str]] = {}
        self.footprints: dict[str, int] = {}  # what each model took when it last loaded (bytes resident)
        self.room = asyncio.Lock()  # one load at a time: each decides room with the others' memory known
        self.idle = asyncio.Event()  # set whenever a model becomes idle or unloads
        self.budget = config.models_memory or int(available_memory() * 0.9)
        if self.folder is not None:  # models may be added to DIR later
            keep_large_allocations_mapped()
        self.loads = self.unloads = 0

    @property
    def catalog(self) -> dict[str, Entry]:
        """The models under DIR by name, as last scanned (the listings rescan: ModelsFolder.surveyed)."""
        return self.folder.entries if self.folder is not None else {}

    # -- requests --------------------------------------------------------------------------------------

    async def use(self, name: str | None, request: Request) -> ServedModel:
        """The model `name` names, loaded if it is not, leased to `request` until its response has been sent."""
        registry = self.state.registry
        if name is None:  # "the only model" means whichever another client loaded last here: never what was meant
            raise APIError(400, f"pass `model`: this server serves the models folder {self.state.config.models_dir} "
                                "(their names: GET /v1/models or /api/tags)", param="model")
        if name not in registry.models:
            entry = await self._entry(name)
            started = time.monotonic()
            # Waiting, the model is this request's from the moment its load ends: a load queued behind it cannot take it
            # as idle before this request resumes and leases it (it did: two clients alternating two models under
            # --max-loaded-models 1 got 404 for 4 requests of 6).
            self.waiting[name] = self.waiting.get(name, 0) + 1
            try:
                while name not in registry.models:
                    await self._loaded(entry)
            finally:
                self.waiting[name] -= 1
                if not self.waiting[name]:
                    del self.waiting[name]
                self.idle.set()  # a request that gave up waiting may have left its model idle
            request.scope.setdefault("state", {})[LOAD_WAIT] = time.monotonic() - started
        model = registry.get(name)
        slot = self.slots.get(model.parent or model.name)
        if slot is not None:  # a --models-dir model: leased (no await between finding it and counting the lease)
            slot.users += 1
            request.scope.setdefault("state", {}).setdefault(LEASES, []).append(model.parent or model.name)
        return model

    async def _entry(self, name: str) -> Entry:
        """The entry `name` names, its facts read again (off the event loop); a 404 for a name DIR does not hold (now),
        this entry's own error for one that is broken. Checked before a load, so a broken one evicts nothing."""
        entry = self.catalog.get(name)
        if entry is None and self.folder is not None:
            await asyncio.to_thread(self.folder.rescan)  # a model added to DIR since is served without a restart
            entry = self.catalog.get(name)
        facts = await asyncio.to_thread(entry.refresh) if entry is not None else None
        if facts is None or facts.gone:
            gone = "was removed from" if facts is not None else "is not in"
            raise APIError(404, f"the model '{name[:100]}' {gone} the models folder {self.state.config.models_dir}; its models "
                                "are listed at GET /v1/models", param="model", code="model_not_found")
        if facts.error is not None:
            raise APIError(500, f"model '{name}' cannot be served: {facts.error}", param="model", code="model_load_failed")
        return entry

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

    def _idle(self, name: str) -> bool:
        """Whether a loaded model may be unloaded: no request holds it, and none waits to (its load just ended)."""
        slot = self.slots.get(name)
        return slot is not None and slot.users == 0 and not self.waiting.get(name)

    # -- loading ---------------------------------------------------------------------------------------

    async def _loaded(self, entry: Entry) -> None:
        failed = self.failed.get(entry.name)
        if failed is not None and time.monotonic() - failed[0] < RETRY_AFTER:
            raise APIError(500, f"model '{entry.name}' could not be loaded: {failed[1]}", param="model", code="model_load_failed")
        if entry.name in self.exporting or (entry.kind != "package" and not entry.exported):  # until its child has ended
            self._export(entry)  # raises the 503 that says so
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

    def _export(self, entry: Entry) -> None:
        """Starts (or finds) the export of a Hugging Face folder or a GGUF, in a child process, and answers its requests
        503 with Retry-After until it is done: an export takes minutes on a real model, longer than a client should hold
        a connection open, and it takes no --models-memory room (its memory is the child's, and goes back when it ends)."""
        running = self.exporting.get(entry.name)
        if running is None:
            async def export() -> None:
                try:
                    async with self.exports:
                        self.exporting[entry.name] = (time.monotonic(), task)
                        await export_in_child(entry)
                except Exception as exc:  # noqa: BLE001 - this model's requests get it, after RETRY_AFTER a request retries
                    message = str(exc).splitlines()[0][:240] if str(exc) else type(exc).__name__
                    self.failed[entry.name] = (time.monotonic(), message)
                    log.error("model '%s' could not be exported: %s", entry.name, message)
                finally:
                    self.exporting.pop(entry.name, None)

            task = asyncio.ensure_future(export())
            running = self.exporting[entry.name] = (time.monotonic(), task)
        began, _ = running
        raise APIError(503, f"model '{entry.name}' is being exported from {entry.source.name} into {EXPORTS}/{entry.name} (once, "
                            f"{time.monotonic() - began:.0f} s so far; progress in the server's log): retry shortly",
                       param="model", code="model_exporting", headers={"Retry-After": "10"})

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
        except Exception as exc:  # this model's requests get it; the others go on
            message = str(exc).splitlines()[0][:240] if str(exc) else type(exc).__name__
            self.failed[entry.name] = (time.monotonic(), message)
            log.error("model '%s' failed to load: %s", entry.name, message)
            raise APIError(500, f"model '{entry.name}' could not be loaded: {message}", param="model", code="model_load_failed") from exc
        self.failed.pop(entry.name, None)

    def _open(self, entry: Entry) -> ServedModel:
        """Loads an entry's package (worker thread); a folder or a GGUF has been exported by then (_export)."""
        model = self.loader(entry.package, entry.name)
        model.task.wait_until_resident()  # its footprint is measured next: a large KV pool's pages mapped first
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
            idle = sorted((slot.last_used, name) for name, slot in self.slots.items() if self._idle(name))
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
            model.engine.shutdown(timeout=5.0)
            model.drop()
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
                if not self._idle(name):
                    continue
                limit = slot.keep_until if slot.keep_until is not None else (slot.last_used + idle_unload if idle_unload else None)
                if limit is not None and now >= limit and not self.room.locked():
                    await self.unload(name)

    # -- what is listed --------------------------------------------------------------------------------

    def unloaded(self) -> list[Entry]:
        """The entries not loaded now, as last surveyed (no disk access: `listed` surveys first)."""
        return [entry for name, entry in self.catalog.items() if name not in self.state.registry.models]

    async def listed(self) -> list[Entry]:
        """The entries not loaded now, DIR rescanned and their facts read again off the event loop where their files
        changed (a listing's: 3,000 folders, each stat'ed and summed on the loop, froze the server 4.4 s per call)."""
        if self.folder is not None:
            await self.folder.surveyed()
        return self.unloaded()

    def is_loaded(self, name: str) -> bool:
        return name in self.state.registry.models

    def summary(self) -> str:
        """The start-up line's words for what is served."""
        count = len(self.catalog)
        return f"the models folder {self.state.config.models_dir} ({count} model{'s' if count != 1 else ''}, loaded on request)"


class Leases:
    """Pure ASGI middleware: the models a request leased (ModelManager.use) are released once its response has been
    sent (a stream's last byte included: the app's call returns only then)."""

    def __init__(self, app, state) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.state.models is None:
            return await self.app(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            for name in (scope.get("state") or {}).get(LEASES, ()):
                self.state.models.release(name)


__all__ = ["EXPORTS", "Entry", "Leases", "ModelManager", "discover"]
