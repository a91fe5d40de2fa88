"""AsyncLoop: a CrossDecoderLoop (runtime/cross_loop.py) stepped by one background thread, so that the
sequences of every request in flight decode together (continuous batching across requests, as
AsyncEngine does for text). A request submits (off the event loop) and awaits its job; a step that
fails fails the sequences in it (their requests get the error) and the loop goes on; a request whose
caller goes away is cancelled at the next step. Subclass: runtime/async_transcriber.py (Whisper).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from ortinf.runtime.cross_loop import CrossDecoderLoop, Job

log = logging.getLogger(__name__)


class AsyncLoop:
    def __init__(self, loop: CrossDecoderLoop, name: str) -> None:
        self.runner = loop
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=f"ortinf-{name}", daemon=True)
        self._thread.start()

    async def run_job(self, submit: Callable[[Callable[[Job], None]], Job]) -> Job:
        """Runs `submit(on_done)` in a worker thread (it tokenises, computes features, queues), then
        waits for the job; raises the job's error."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[Job] = loop.create_future()

        def done(job: Job) -> None:
            try:
                loop.call_soon_threadsafe(lambda: finished.done() or finished.set_result(job))
            except RuntimeError:  # the request's loop is gone
                pass

        job = await asyncio.to_thread(submit, done)
        self._wake.set()
        try:
            await finished
        except asyncio.CancelledError:  # the caller went away: its sequences stop at the next step
            self.runner.cancel(job)
            self._wake.set()
            raise
        if job.error is not None:
            raise job.error
        return job

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopping:
            if not self.runner.busy:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                self.runner.step()
            except Exception as exc:  # noqa: BLE001 - the requests in the step fail; the loop goes on
                log.exception("a decoder step failed")
                self.runner.fail_all(exc)
