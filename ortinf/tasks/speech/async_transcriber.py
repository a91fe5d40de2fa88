"""AsyncTranscriber: a Transcriber's windows as requests of the server's AsyncEngine, the one stepping
thread of the model (ortinf/runtime/engine/async_engine.py), so that the windows of every request in flight decode
together and inherit the engine's admission, preemption, failure isolation, metrics and shutdown. A
request submits its audio and awaits it, or streams its text as windows are kept.

Decoding follows OpenAI's transcription API: temperature 0 means openai-whisper's schedule, greedy
first, then 0.2, 0.4, ... 1.0 for a window whose text repeats (compression ratio over 2.4) or is
unlikely (mean log-probability under -1); a window that is probably silence is skipped. Models with
timestamp tokens (every real Whisper) go window after window, each prompted with the text so far.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

import numpy as np

from ortinf.runtime.engine.async_engine import AsyncEngine
from ortinf.runtime.engine.llm_engine import PreparedRequest
from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.tasks.speech.audio_features import SAMPLE_RATE
from ortinf.tasks.speech.longform import Decoding, openai_decoding
from ortinf.tasks.speech.transcriber import Job, Transcriber
from ortinf.tasks.speech.windows import Window


class AsyncTranscriber:
    def __init__(self, transcriber: Transcriber, engine: AsyncEngine, fallback: bool = True) -> None:
        self.transcriber = transcriber
        self.engine = engine  # over transcriber.engine
        self.fallback = fallback
        self._lock = threading.Lock()  # a window's end runs off the event loop (word timing): one at a time

    def decoding(self, temperature: float, seed: int | None, timed: bool) -> Decoding:
        return openai_decoding(temperature, timed, self.transcriber.no_speech is not None, self.fallback, seed)

    async def transcribe(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe", temperature: float = 0.0,
                         seed: int | None = None, prompt: str | None = None,
                         words: bool = False) -> tuple[list[tuple[float, float, str]], list[tuple[str, float, float]], dict]:
        """(segments, words, details) of `samples`: the model's timestamped segments, window after window, where
        it has timestamp tokens, else its 30-second windows side by side; words only when asked; details the
        language and each segment's decoding (Transcriber.details)."""
        timed = self.transcriber.rules is not None
        job = await self._run(samples, language, task, temperature, seed, prompt, timed, words=words)
        duration = len(samples) / SAMPLE_RATE
        segments = self.transcriber.segments(job, duration)
        return segments, self.transcriber.words(job) if words else [], self.transcriber.details(job, duration)

    async def transcribe_segments(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe",
                                  temperature: float = 0.0, seed: int | None = None, prompt: str | None = None) -> list[str]:
        """The text of each 30-second window of `samples` (16 kHz mono), decoded side by side."""
        job = await self._run(samples, language, task, temperature, seed, prompt, timed=False)
        return [self.transcriber._text(ids) for ids in job.results]

    async def transcribe_timed(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe",
                               temperature: float = 0.0, seed: int | None = None,
                               prompt: str | None = None) -> list[tuple[float, float, str]]:
        """(start, end, text) of each segment the model timestamps, window after window (ortinf/tasks/speech/longform.py)."""
        job = await self._run(samples, language, task, temperature, seed, prompt, timed=True)
        return self.transcriber.segments(job, len(samples) / SAMPLE_RATE)

    async def stream(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe",
                     temperature: float = 0.0, seed: int | None = None, prompt: str | None = None) -> AsyncIterator[str]:
        """The text as it is kept: one piece per segment (timestamped models) or window, in order.
        Nothing is sent that a later retry or seek could take back."""
        queue: asyncio.Queue[list[str]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def kept(job: Job) -> None:  # off the event loop (a window's end)
            texts = self.transcriber.committed(job)
            loop.call_soon_threadsafe(queue.put_nowait, texts)

        timed = self.transcriber.rules is not None
        task_ = asyncio.ensure_future(self._run(samples, language, task, temperature, seed, prompt, timed, on_window=kept))
        sent = 0
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task_}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    texts = getter.result()
                    for text in texts[sent:]:
                        yield text
                    sent = max(sent, len(texts))
                    continue
                getter.cancel()
                job = task_.result()  # raises the job's error
                for text in self.transcriber.committed(job)[sent:]:
                    yield text
                return
        finally:
            if not task_.done():
                task_.cancel()
                await asyncio.gather(task_, return_exceptions=True)  # its requests aborted before the stream ends

    async def _run(self, samples: np.ndarray, language: str | None, task: str, temperature: float, seed: int | None,
                   prompt: str | None, timed: bool, on_window: Callable[[Job], None] | None = None, words: bool = False) -> Job:
        transcriber = self.transcriber
        decoding = self.decoding(temperature, seed, timed)
        decoding.word_timestamps = words
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Job] = loop.create_future()

        def on_done(job: Job) -> None:  # off the event loop
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(job))

        def submit() -> Job:  # off the event loop: a prompt is tokenised, and the log-mel is computed
            if timed:
                forced = transcriber._prompt(language, task, None, timestamps=True)
                previous = transcriber._prompt(language, task, prompt, timestamps=True)[: -len(forced)] if prompt else None
                return transcriber.submit_long(samples, forced, decoding, on_done=on_done, prompt_ids=previous, on_window=on_window,
                                               start=False)
            forced = transcriber._prompt(language, task, prompt, timestamps=False)
            return transcriber.submit(transcriber.windows(samples), forced, on_done=on_done, decoding=decoding, on_window=on_window,
                                      frames=transcriber.window_frames(samples), start=False)

        job = await asyncio.to_thread(submit)
        drivers = [asyncio.ensure_future(self._drive(window)) for window in job.fresh]
        try:
            await done
        except asyncio.CancelledError:  # the caller went away: every window's request is aborted
            job.cancelled = True
            for driver in drivers:
                driver.cancel()
            await asyncio.gather(*drivers, return_exceptions=True)
            raise
        if job.error is not None:
            raise job.error
        return job

    async def _drive(self, window: Window) -> None:
        """Requests what the window needs until it ends (its probe, retries, a long-form job's next windows)."""
        following = [window]
        while following:
            window, *rest = following
            for other in rest:  # (a window ends with one request to follow it at most: none today)
                asyncio.ensure_future(self._drive(other))
            try:
                request_id, prepared, probe = self.transcriber.request(window)
                outcome: RequestOutput | BaseException = await self._final(prepared, request_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - this window's request failed: its job fails, the engine goes on
                outcome, probe = exc, False
            try:
                following = await asyncio.to_thread(self._finished, window, probe, outcome)
            except Exception as exc:  # noqa: BLE001 - judging or timing it failed: its job fails alone
                window.job.error = window.job.error or exc
                following = self._finished_failed(window)

    def _finished(self, window: Window, probe: bool, outcome: RequestOutput | BaseException) -> list[Window]:
        with self._lock:
            return self.transcriber.finished(window, probe, outcome)

    def _finished_failed(self, window: Window) -> list[Window]:
        with self._lock:
            return self.transcriber._close(window)

    async def _final(self, prepared: PreparedRequest, request_id: str) -> RequestOutput:
        last = None
        async for output in self.engine.generate(prepared, request_id=request_id):
            last = output
        return last
