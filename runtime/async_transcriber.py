"""AsyncTranscriber: a Transcriber on runtime/async_loop.py's stepping thread, so that the windows of
every request in flight decode together: a request submits its audio and awaits it, or streams its
text as windows are kept.

Decoding follows OpenAI's transcription API: temperature 0 means openai-whisper's schedule, greedy
first, then 0.2, 0.4, ... 1.0 for a window whose text repeats (compression ratio over 2.4) or is
unlikely (mean log-probability under -1); a window that is probably silence is skipped. Models with
timestamp tokens (every real Whisper) go window after window, each prompted with the text so far.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from ortinf.runtime.async_loop import AsyncLoop
from ortinf.runtime.audio_features import SAMPLE_RATE
from ortinf.runtime.longform import Decoding, openai_decoding
from ortinf.runtime.transcriber import Job, Transcriber


class AsyncTranscriber(AsyncLoop):
    def __init__(self, transcriber: Transcriber, fallback: bool = True) -> None:
        super().__init__(transcriber, "transcriber")
        self.transcriber = transcriber
        self.fallback = fallback

    def decoding(self, temperature: float, seed: int | None, timed: bool) -> Decoding:
        return openai_decoding(temperature, timed, self.transcriber.no_speech is not None, self.fallback, seed)

    async def transcribe(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe", temperature: float = 0.0,
                         seed: int | None = None, prompt: str | None = None,
                         words: bool = False) -> tuple[list[tuple[float, float, str]], list[tuple[str, float, float]]]:
        """(segments, words) of `samples`: the model's timestamped segments, window after window, where it
        has timestamp tokens, else its 30-second windows side by side; words only when asked."""
        timed = self.transcriber.rules is not None
        job = await self._run(samples, language, task, temperature, seed, prompt, timed, words=words)
        segments = self.transcriber.segments(job, len(samples) / SAMPLE_RATE)
        return segments, self.transcriber.words(job) if words else []

    async def transcribe_segments(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe",
                                  temperature: float = 0.0, seed: int | None = None, prompt: str | None = None) -> list[str]:
        """The text of each 30-second window of `samples` (16 kHz mono), decoded side by side."""
        job = await self._run(samples, language, task, temperature, seed, prompt, timed=False)
        return [self.transcriber._text(ids) for ids in job.results]

    async def transcribe_timed(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe",
                               temperature: float = 0.0, seed: int | None = None,
                               prompt: str | None = None) -> list[tuple[float, float, str]]:
        """(start, end, text) of each segment the model timestamps, window after window (runtime/longform.py)."""
        job = await self._run(samples, language, task, temperature, seed, prompt, timed=True)
        return self.transcriber.timed_segments(job)

    async def stream(self, samples: np.ndarray, language: str | None = None, task: str = "transcribe",
                     temperature: float = 0.0, seed: int | None = None, prompt: str | None = None) -> AsyncIterator[str]:
        """The text as it is kept: one piece per segment (timestamped models) or window, in order.
        Nothing is sent that a later retry or seek could take back."""
        queue: asyncio.Queue[list[str] | Job] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def kept(job: Job) -> None:  # on the stepping thread
            texts = self.transcriber.committed(job)
            try:
                loop.call_soon_threadsafe(queue.put_nowait, texts)
            except RuntimeError:  # the request's loop is gone
                pass

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

    async def _run(self, samples: np.ndarray, language: str | None, task: str, temperature: float, seed: int | None,
                   prompt: str | None, timed: bool, on_window=None, words: bool = False) -> Job:  # noqa: ANN001
        transcriber = self.transcriber
        decoding = self.decoding(temperature, seed, timed)
        decoding.word_timestamps = words
        def submit(done) -> Job:  # noqa: ANN001 - off the event loop: a prompt is tokenised, and the log-mel is computed
            if timed:
                forced = transcriber._prompt(language, task, None, timestamps=True)
                previous = transcriber._prompt(language, task, prompt, timestamps=True)[: -len(forced)] if prompt else None
                return transcriber.submit_long(samples, forced, decoding, on_done=done, prompt_ids=previous, on_window=on_window)
            forced = transcriber._prompt(language, task, prompt, timestamps=False)
            return transcriber.submit(transcriber.windows(samples), forced, on_done=done, decoding=decoding, on_window=on_window,
                                      frames=transcriber.window_frames(samples))

        return await self.run_job(submit)
