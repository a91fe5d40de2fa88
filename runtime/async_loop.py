"""AsyncLoop: a CrossDecoderLoop (runtime/cross_loop.py) stepped by one background thread, so that the
sequences of every request in flight decode together (continuous batching across requests, as
AsyncEngine does for text). A request submits (off the event loop) and awaits its job; a step that
fails fails the sequences in it (their requests get the error) and the loop goes on; a request whose
caller goes away is cancelled at the next step. Subclasses: runtime/async_transcriber.py (Whisper),
AsyncSeq2Seq below (Marian, BART).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np

from ortinf.runtime.cross_loop import CrossDecoderLoop, Job
from ortinf.runtime.longform import Decoding

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


class AsyncSeq2Seq(AsyncLoop):
    """runtime/seq2seq.py's Seq2Seq for the server: each request's sources join the running batch."""

    def __init__(self, seq2seq: object) -> None:
        super().__init__(seq2seq, "seq2seq")

    async def generate(self, sources: Sequence[Sequence[int]], max_new_tokens: int | None, temperature: float = 0.0,
                       seed: int | None = None) -> list[list[int]]:
        """Each source's output ids (EOS not included), sampled at `temperature` (0: greedy)."""
        runner = self.runner
        runner.check_sources(sources)
        decoding = Decoding(max_new_tokens, (temperature,), seed)
        jobs = []
        for source in sources:
            jobs.append(self.run_job(lambda done, s=source: runner.submit([np.asarray(s, dtype=np.int64)], [runner.decoder_start],
                                                                        decoding=Decoding(decoding.max_new_tokens,
                                                                                          decoding.temperatures, decoding.seed),
                                                                        on_done=done)))
        return [job.results[0] for job in await asyncio.gather(*jobs)]
