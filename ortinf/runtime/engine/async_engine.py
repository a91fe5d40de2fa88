"""AsyncEngine: the engine's step loop in a background thread, one async mailbox per caller.

Only the engine thread touches the LLMEngine. Callers validate their request in their own thread
(`LLMEngine.prepare` is pure), then hand it over through a command queue; outputs come back to each
caller's mailbox with `call_soon_threadsafe`. Closing a stream before it finishes (a client that
went away) aborts the request, which frees its KV blocks before the next step.

Bounded memory: a caller's mailbox keeps one pending output per request, the deltas it has not read
joined (a reader that stalls for a thousand steps finds one output per request, not a thousand).

Failure isolation: a step that fails ends only its own requests (LLMEngine.step); the loop goes on.
Only when `MAX_FAILED_STEPS` steps in a row fail (each with different requests, since a failed
request is gone) is the failure no request's fault: the engine is declared dead, every open stream
gets EngineDeadError, and `on_dead` runs (the server exits non-zero so a supervisor restarts it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from ortinf.errors import RequestError
from ortinf.runtime.engine.llm_engine import LLMEngine
from ortinf.runtime.engine.outputs import EngineStats, RequestOutput
from ortinf.runtime.engine.prepared import PreparedRequest
from ortinf.runtime.sample.sampling_params import SamplingParams

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_FAILED_STEPS = 3  # failing steps in a row after which the engine, not a request, is at fault


class EngineDeadError(RuntimeError):
    """The engine loop failed for a reason no request explains; the process must restart."""


class _Mailbox:
    """One caller's mailbox between the engine thread and its reader (a program's requests share one):
    per request, what the reader has not taken yet as one item (a delta is joined to the pending one, a
    cumulative output replaces it, so a slow reader holds one item per request, never a backlog of
    steps), or the exception that ended that request."""

    __slots__ = ("loop", "pending", "ready")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[str, RequestOutput | BaseException] = {}
        self.ready = asyncio.Event()

    def put(self, request_id: str, item: RequestOutput | BaseException) -> None:
        earlier = self.pending.get(request_id)
        if isinstance(earlier, BaseException):
            return  # the request ended with it; nothing follows
        self.pending[request_id] = earlier.followed_by(item) if isinstance(earlier, RequestOutput) and not isinstance(item, BaseException) else item
        self.ready.set()

    async def take(self) -> dict[str, RequestOutput | BaseException]:
        await self.ready.wait()
        self.ready.clear()
        taken, self.pending = self.pending, {}
        return taken


class Channel:
    """One caller's requests through one mailbox (ortinf/tasks/driver.py's): requests are added at any time,
    `take` returns what advanced since the last take (an output, or the exception that ended a request, by
    request id), and `close` aborts every request not yet finished. A request's failure is its own: the
    caller decides whether it ends the others."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.mailbox = _Mailbox(asyncio.get_running_loop())
        self.open: set[str] = set()  # added, not yet finished or failed

    def add(self, request_id: str, prepared: PreparedRequest) -> None:
        self.engine._register(request_id, self.mailbox)
        self.open.add(request_id)
        self.engine._send(("add", request_id, prepared))

    async def take(self) -> dict[str, RequestOutput | BaseException]:
        taken = await self.mailbox.take()
        for request_id, item in taken.items():
            if isinstance(item, BaseException) or item.finished:
                self.open.discard(request_id)
        return taken

    def close(self) -> None:
        for request_id in self.open:
            self.engine.abort(request_id)
        self.open.clear()


class AsyncEngine:
    """Runs an LLMEngine in a thread; `generate` streams one request's outputs, a Channel a caller's several
    requests through one mailbox."""

    def __init__(self, engine: LLMEngine, on_step: Callable[[EngineStats, list[RequestOutput]], None] | None = None,
                 on_dead: Callable[[BaseException], None] | None = None) -> None:
        """`on_step` runs in the engine thread after every step with the engine's stats and the step's
        outputs (metrics); `on_dead` once, in the engine thread, when the engine is declared dead."""
        self.engine = engine
        self._on_step = on_step
        self._on_dead = on_dead
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # guards _streams and error: a request is registered before death or sees it
        self._streams: dict[str, _Mailbox] = {}  # request id -> its caller's mailbox
        self._ids = itertools.count()
        self._stopping = False
        self._failing: BaseException | None = None  # set by fail_all: what every request registered after it gets
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="ortinf-engine", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self.error is None and self._thread.is_alive()

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    async def generate(self, prompt: str | Sequence[int] | PreparedRequest, params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Streams one request's outputs until it finishes; RequestError is raised before anything runs,
        StepFailedError when a step fails it, EngineDeadError when the engine dies. Closing it early aborts
        the request. Several requests as one (n samples, a beam search, a Whisper job): ortinf/tasks/driver.py."""
        prepared = prompt if isinstance(prompt, PreparedRequest) else self.engine.prepare(prompt, params)
        channel = Channel(self)
        request_id = request_id or f"req-{next(self._ids)}"
        channel.add(request_id, prepared)
        try:
            while channel.open:
                for item in (await channel.take()).values():
                    if isinstance(item, BaseException):
                        raise item
                    yield item
        finally:
            channel.close()  # now, not when collected: closing aborts an unfinished request

    def _register(self, request_id: str, mailbox: _Mailbox) -> None:
        with self._lock:
            if self.error is not None or not self._thread.is_alive():
                raise EngineDeadError(f"the engine has failed: {self.error or 'its thread has stopped'}")
            if request_id in self._streams:
                raise RequestError(f"request id {request_id!r} is already in use")
            if self._failing is not None:  # past the drain deadline: a program's next step is refused too
                raise self._failing
            self._streams[request_id] = mailbox

    async def call(self, function: Callable[[LLMEngine], T]) -> T:
        """Runs `function(engine)` on the engine thread between steps (what must not race a step:
        loading a LoRA adapter) and returns its result, or raises its exception here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        if self.error is not None or not self._thread.is_alive():
            raise EngineDeadError(f"the engine has failed: {self.error or 'its thread has stopped'}")
        self._send(("call", future, function))
        return await future

    def abort(self, request_id: str) -> None:
        """Asks the engine thread to end a request and free its blocks before its next step."""
        self._send(("abort", request_id, None))

    def fail_all(self, error: BaseException) -> None:
        """Ends every open request now, each stream receiving `error`, and refuses every request added after it with
        the same error (the server's drain deadline: a beam search whose step had just ended, or a request still
        preparing, must not start new requests that run past it)."""
        with self._lock:
            self._failing = error
        self._send(("fail_all", None, error))

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)
        close = getattr(self.engine, "close", None)
        if close is not None and not self._thread.is_alive():
            close()

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        if isinstance(item, RequestOutput) and item.error is not None:
            item = item.error
        done = isinstance(item, BaseException) or item.finished
        with self._lock:
            found = self._streams.pop(request_id, None) if done else self._streams.get(request_id)
        if found is None:
            return
        try:
            found.loop.call_soon_threadsafe(found.put, request_id, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
            with self._lock:
                self._streams.pop(request_id, None)
            if not done:
                self.engine.abort(request_id)

    def _run_commands(self) -> None:
        while True:
            try:
                kind, request_id, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "call":  # request_id is the caller's future, payload the function
                self._call(request_id, payload)
                continue
            try:
                if kind == "fail_all":
                    with self._lock:
                        open_ids = list(self._streams)
                    for open_id in open_ids:
                        self.engine.abort(open_id)
                        self._deliver(open_id, payload)
                    continue
                if kind == "add":
                    self.engine.add_request(payload, request_id=request_id)
                elif kind == "abort":
                    output = self.engine.abort(request_id)
                    if output is None:
                        with self._lock:
                            self._streams.pop(request_id, None)
                        continue
                    self._report([output])
            except Exception as exc:  # handed to the caller's stream; the loop goes on
                if kind == "abort":
                    log.exception("aborting request %s failed", request_id)
                self._deliver(request_id, exc)

    def _call(self, future: asyncio.Future, function: Callable[[LLMEngine], object]) -> None:
        try:
            result, error = function(self.engine), None
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            result, error = None, exc

        def settle() -> None:
            if not future.done():
                future.set_exception(error) if error is not None else future.set_result(result)

        try:
            future.get_loop().call_soon_threadsafe(settle)
        except RuntimeError:  # the caller's loop is closed
            pass

    def _report(self, outputs: list[RequestOutput]) -> None:
        if self._on_step is not None:
            try:
                stats = self.engine.stats()
                # running: every request in flight that is not waiting, this step's finished ones included (they are
                # delivered after this). A beam search's step requests end every step and its next ones are added
                # after: the scheduler alone would show its beams running 0 of the time.
                with self._lock:
                    in_flight = len(self._streams)
                self._on_step(replace(stats, num_running=max(stats.num_running, in_flight - stats.num_waiting)), outputs)
            except Exception:  # metrics must never stop the engine
                log.exception("the on_step hook failed")
        for output in outputs:
            self._deliver(output.request_id, output)

    def _loop(self) -> None:
        idle_reported = True
        try:
            while not self._stopping:
                self._run_commands()
                if not self.engine.has_unfinished_requests():
                    if not idle_reported and self._wake.wait(0.05) is False:  # idle (no next step coming): gauges to now
                        self._report([])
                        idle_reported = True
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                idle_reported = False
                self._report(self.engine.step())
                if self.engine.num_failed_steps_in_a_row >= MAX_FAILED_STEPS:
                    raise EngineDeadError(f"{self.engine.num_failed_steps_in_a_row} engine steps in a row failed, "
                                          "each with different requests: the engine, not a request, is at fault")
        except BaseException as exc:  # a dead loop must reach every waiting client
            log.critical("engine loop failed: %s", exc, exc_info=exc)
            self._die(exc, EngineDeadError(f"the engine failed: {exc}"))
            if self._on_dead is not None:
                self._on_dead(exc)
            return
        self._die(EngineDeadError("the engine has shut down"), EngineDeadError("the engine has shut down"))

    def _die(self, cause: BaseException, error: EngineDeadError) -> None:
        """No stream may wait forever: each open one gets `error`, and no new one registers."""
        with self._lock:
            self.error = cause
            streams = list(self._streams)
        for request_id in streams:
            self._deliver(request_id, error)
