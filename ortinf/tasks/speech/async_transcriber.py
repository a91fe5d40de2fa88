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
import itertools
import threading
from collections.abc import AsyncIterator, Callable

import numpy as np

from ortinf.runtime.engine.async_engine import AsyncEngine
from ortinf.tasks import driver
from ortinf.tasks.speech.audio_features import SAMPLE_RATE
from ortinf.tasks.speech.longform import Decoding, openai_decoding
from ortinf.tasks.speech.transcriber import Job, Transcriber
from ortinf.tasks.speech.windows import WindowJob


class AsyncTranscriber:
    def __init__(self, transcriber: Transcriber, engine: AsyncEngine, fallback: bool = True) -> None:
        self.transcriber = transcriber
        self.engine = engine  # over transcriber.engine
        self.fallback = fallback
        self._lock = threading.Lock()  # a window's end runs off the event loop (word timing): one at a time
        self._ids = itertools.count()

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

        def submit() -> Job:  # off the event loop: a prompt is tokenised, and the log-mel is computed
            if timed:
                forced = transcriber._prompt(language, task, None, timestamps=True)
                previous = transcriber._prompt(language, task, prompt, timestamps=True)[: -len(forced)] if prompt else None
                return transcriber.submit_long(samples, forced, decoding, prompt_ids=previous, on_window=on_window)
            forced = transcriber._prompt(language, task, prompt, timestamps=False)
            return transcriber.submit(transcriber.windows(samples), forced, decoding=decoding, on_window=on_window,
                                      frames=transcriber.window_frames(samples))

        job = await asyncio.to_thread(submit)
        try:
            await driver.finish(self.engine, WindowJob(transcriber, job, self._lock), f"job-{next(self._ids)}")
        except asyncio.CancelledError:  # the caller went away: its windows' requests are aborted as the driver closes
            job.cancelled = True
            raise
        if job.error is not None:
            raise job.error
        return job
