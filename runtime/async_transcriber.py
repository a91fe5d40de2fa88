"""AsyncTranscriber: a Transcriber stepped by one background thread, so that the windows of every
request in flight decode together (continuous batching across requests, as AsyncEngine does for
text): a request submits its windows and awaits them; a window that ends frees its slot for whoever
waits. A step that fails fails the windows in it (their requests get the error) and the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np

from ortinf.runtime.transcriber import Job, Transcriber

log = logging.getLogger(__name__)


class AsyncTranscriber:
    def __init__(self, transcriber: Transcriber) -> None:
        self.transcriber = transcriber
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="ortinf-transcriber", daemon=True)
        self._thread.start()

    async def transcribe_segments(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe",
                                  temperature: float = 0.0, seed: int | None = None, prompt: str | None = None) -> list[str]:
        """The text of each 30-second window of `samples` (16 kHz mono); greedy, or sampled at `temperature`."""
        job = await self._run(samples, language, task, temperature, seed, prompt, timestamps=False)
        return [self.transcriber._text(ids) for ids in job.results]

    async def transcribe_timed(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe",
                               temperature: float = 0.0, seed: int | None = None,
                               prompt: str | None = None) -> list[tuple[float, float, str]]:
        """(start, end, text) of each segment the model timestamps (runtime/whisper_timestamps.py)."""
        job = await self._run(samples, language, task, temperature, seed, prompt, timestamps=True)
        return self.transcriber.timed_segments(job)

    async def _run(self, samples: np.ndarray, language: str | None, task: str, temperature: float, seed: int | None,
                   prompt: str | None, timestamps: bool) -> Job:
        transcriber = self.transcriber
        # both off the event loop: a prompt is tokenised, and every window's log-mel is computed
        forced, windows = await asyncio.to_thread(lambda: (transcriber._prompt(language, task, prompt, timestamps),
                                                           transcriber.windows(samples)))
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[Job] = loop.create_future()

        def done(job: Job) -> None:
            try:
                loop.call_soon_threadsafe(lambda: finished.done() or finished.set_result(job))
            except RuntimeError:  # the request's loop is gone
                pass

        transcriber.submit(windows, forced, on_done=done, temperature=temperature, seed=seed, timestamps=timestamps)
        self._wake.set()
        job = await finished
        if job.error is not None:
            raise job.error
        return job

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopping:
            if not self.transcriber.busy:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                self.transcriber.step()
            except Exception as exc:  # noqa: BLE001 - the requests in the step fail; the loop goes on
                log.exception("a transcription step failed")
                self.transcriber.fail_all(exc)
