"""AsyncEngine: the engine's step loop in a background thread, an async stream per request.

Only the engine thread touches the LLMEngine. Callers validate their request in their own thread
(`LLMEngine.prepare` is pure), then hand it over through a command queue; outputs come back through
each request's asyncio queue with `call_soon_threadsafe`. Closing a stream before it finishes (a
client that went away) aborts the request, which frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from ortinf.runtime.engine import LLMEngine, PreparedRequest
from ortinf.runtime.outputs import RequestOutput
from ortinf.runtime.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop failed; no request can run until the process restarts."""


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class AsyncEngine:
    """Runs an LLMEngine in a thread; `generate` yields cumulative RequestOutputs."""

    def __init__(self, engine: LLMEngine, on_step: Callable[[LLMEngine, list[RequestOutput]], None] | None = None,
                 fail_after_steps: int | None = None) -> None:
        """`on_step` runs in the engine thread after every step (metrics); `fail_after_steps` injects
        an engine failure for fault tests (ORTINF_DEBUG_FAIL_AFTER_STEPS)."""
        self.engine = engine
        self._on_step = on_step
        self._fail_after_steps = fail_after_steps
        self._num_steps = 0
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._stopping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="ortinf-engine", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self.error is None and self._thread.is_alive()

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    async def generate(self, prompt: str | Sequence[int] | PreparedRequest, params: SamplingParams | None = None, request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Streams the request's outputs until it finishes; RequestError is raised before anything runs."""
        if self.error is not None:
            raise EngineDeadError(f"the engine has failed: {self.error}")
        prepared = prompt if isinstance(prompt, PreparedRequest) else self.engine.prepare(prompt, params)
        request_id = request_id or f"req-{next(self._ids)}"
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream
        self._send(("add", request_id, prepared))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Asks the engine thread to end a request and free its blocks before its next step."""
        self._send(("abort", request_id, None))

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        done = isinstance(item, BaseException) or item.finished
        if done:
            del self._streams[request_id]
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening any more
            self._streams.pop(request_id, None)
            if not done:
                self.engine.abort(request_id)

    def _run_commands(self) -> None:
        while True:
            try:
                kind, request_id, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                try:
                    self.engine.add_request(payload, request_id=request_id)
                except Exception as exc:  # noqa: BLE001 - handed to the caller's stream
                    self._deliver(request_id, exc)
            elif kind == "abort":
                output = self.engine.abort(request_id)
                if output is not None:
                    if self._on_step is not None:
                        self._on_step(self.engine, [output])
                    self._deliver(request_id, output)
                else:
                    self._streams.pop(request_id, None)

    def _loop(self) -> None:
        try:
            while not self._stopping:
                self._run_commands()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                outputs = self.engine.step()
                self._num_steps += 1
                if self._fail_after_steps is not None and self._num_steps >= self._fail_after_steps:
                    raise RuntimeError(f"injected engine failure after {self._num_steps} steps")
                if self._on_step is not None:
                    self._on_step(self.engine, outputs)
                for output in outputs:
                    self._deliver(output.request_id, output)
        except BaseException as exc:  # noqa: BLE001 - a failed step must reach every waiting client
            log.exception("engine loop failed")
            self.error = exc
            for request_id in list(self._streams):
                self._deliver(request_id, EngineDeadError(f"the engine failed: {exc}"))
