"""WindowDecoder: Whisper's 30-second windows as ordinary requests of the one engine (ortinf/runtime/engine/llm_engine.py).

A window is one engine request: its prompt the forced start (start of transcript, language, task, maybe
no-timestamps, behind <|startofprev|> and a prompt or the text so far), its encoder input the window's
log-mel (ortinf/runtime/worker/encoder_input.py: the engine gives it cross blocks, runs the encoder into them, caches
them by the audio's digest, preempts and isolates failures as for text), and its options ask the engine
for the package's Whisper rules (suppressed tokens, the timestamp rules: RequestOptions.whisper_timestamps,
ortinf/runtime/sample/whisper_rules.py), as transformers' generate applies them. This module is the
logic between requests, with no loop of its own: a job is a program (WindowJob, below) that the one driver
(ortinf/tasks/driver.py) runs on an LLMEngine (ortinf/tasks/speech/transcriber.py) or on the server's AsyncEngine
(ortinf/tasks/speech/async_transcriber.py):

    window --(language to detect, or a no-speech threshold)--> probe request: prompt up to the start of
       |                                                       transcript, 1 token (its logits say both)
       v
    window request --finished--> judged (ortinf/tasks/speech/longform.py): retried at the next temperature (a new
       request: the cross blocks and prompt blocks are found in the pool), skipped as silence, or kept;
       long form: a kept window's timestamps say where the next window starts (`seek`), a new request.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ortinf.errors import RequestError
from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.runtime.engine.prepared import PreparedRequest
from ortinf.runtime.sample.request_options import RequestOptions
from ortinf.runtime.sample.sampling_params import GREEDY_BELOW, SEED_RANGE, SamplingParams
from ortinf.runtime.worker.encoder_input import EncoderInput
from ortinf.tasks.programs import Handed, Program
from ortinf.tasks.speech.longform import Decoding, Segment, compression_ratio, history, judge, split_segments, window_features

DETECT = -1  # a prompt's language token, to be detected by the window's probe
CANCELLED = RequestError("the request was cancelled")


@dataclass(frozen=True, slots=True)
class WindowStats:
    """How a kept window was decoded: OpenAI's verbose_json segment fields."""

    seek: int  # its first feature frame (10 ms each) in the audio
    temperature: float  # of the kept attempt
    avg_logprob: float  # mean log-probability of its sampled tokens (EOS included when it came)
    compression_ratio: float
    no_speech_prob: float  # 0 where the model was not asked (no probe)


@dataclass(slots=True)
class Job:
    """One audio: its decoding options and each window's tokens as they end.
    Two kinds: fixed 30-second windows decoded side by side (`submit`), or windows one after another, each
    starting where the last one's timestamps end and prompted with its text (`submit_long`: `features` set)."""

    decoding: Decoding
    results: list[list[int]]  # each window's tokens (the kept attempt; [] for a skipped window)
    pending: int  # windows not ended yet
    max_new_tokens: int | None = None
    error: BaseException | None = None
    features: np.ndarray | None = None  # long form: the whole audio's log-mel, windows cut from it at `seek`
    num_frames: int = 0  # long form: the audio's real frames (the features may be padded past them)
    seek: int = 0  # frames
    segments: list[Segment] = field(default_factory=list)
    init: list[int] = field(default_factory=list)  # long form: start, language, task (no-timestamps)
    prompt_ids: list[int] = field(default_factory=list)  # long form: <|startofprev|> and the request's prompt
    condition: bool = False  # the next window is prompted with the text so far
    on_window: Callable[[Job], None] | None = None  # runs each time a window is kept (on the driver's thread)
    closed: set[int] = field(default_factory=set)  # the windows kept so far
    cancelled: bool = False  # its caller went away: its windows end at the next step
    timings: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)  # window -> kept tokens, their times (s)
    fresh: list[Window] = field(default_factory=list)  # its first windows (WindowJob.start requests them)
    language: int | None = None  # the language token the kept windows were decoded under (given or detected)
    stats: dict[int, WindowStats] = field(default_factory=dict)  # each kept window's

    @property
    def timestamps(self) -> bool:
        return self.decoding.timestamps


@dataclass(slots=True, eq=False)
class Window:
    job: Job
    index: int  # within the job
    features: np.ndarray
    prompt: list[int]  # the forced tokens (DETECT where the language is still to find)
    encoder: EncoderInput
    frames: int = 0  # real feature frames in the window
    offset: float = 0.0  # seconds into the audio
    attempt: int = 0  # which of the decoding's temperatures
    probed: bool = False
    no_speech_prob: float | None = None


class WindowDecoder:
    """What a Whisper package's windows need from it, set by ortinf/tasks/speech/transcriber.py's constructor."""

    eos: set[int]
    vocab_size: int
    max_model_len: int
    decoder_start: int
    source_positions: int
    rules = None  # TimestampRules when the model has timestamp tokens
    no_speech: int | None = None  # <|nospeech|>
    language_ids = np.zeros(0, dtype=np.int64)
    generation: dict
    window_seconds = 30.0
    outcomes: dict[str, int]

    def _job(self, decoding: Decoding, windows: int) -> Job:
        decoding.check()
        return Job(decoding, [[] for _ in range(windows)], max(windows, 1), decoding.max_new_tokens)

    def _window(self, job: Job, index: int, features: np.ndarray, prompt: list[int], frames: int = 0, offset: float = 0.0) -> Window:
        return Window(job, index, features, prompt, EncoderInput.of(features, self.source_positions, "audio"), frames=frames, offset=offset)

    def request(self, window: Window) -> tuple[PreparedRequest, bool]:
        """(the request, whether it is the window's probe) that the window needs next."""
        job = window.job
        needs_probe = DETECT in window.prompt or (job.decoding.no_speech_threshold is not None and self.no_speech is not None)
        if needs_probe and not window.probed:
            sot = len(window.prompt) - 1 - window.prompt[::-1].index(self.decoder_start)
            # the probe: the no-speech probability off the logits after the start of transcript, and the
            # language (only language tokens may come) when it is to be detected
            detect = DETECT in window.prompt and self.language_ids.size
            params = SamplingParams(max_tokens=1, temperature=0.0, allowed_token_ids=tuple(self.language_ids.tolist()) if detect else None)
            watch = (self.no_speech,) if job.decoding.no_speech_threshold is not None and self.no_speech is not None else ()
            options = RequestOptions(output_kind="final_only", watch_token_ids=watch)
            return PreparedRequest(None, list(window.prompt[: sot + 1]), params, None, window.encoder, options=options), True
        decoding = job.decoding
        budget = self.max_model_len - len(window.prompt)
        budget = min(job.max_new_tokens or budget, budget)
        if budget < 1:
            raise RequestError(f"the prompt leaves no room to decode in {self.max_model_len} positions", param="prompt")
        temperature = decoding.temperatures[window.attempt]
        seed = None if decoding.seed is None else (decoding.seed * 1_000_003 + window.index * 1009 + window.attempt) % SEED_RANGE
        params = SamplingParams(max_tokens=budget, temperature=temperature if temperature >= GREEDY_BELOW else 0.0, seed=seed,
                                logprobs=0)  # the fallback's judge and verbose_json's avg_logprob (of the rows after the rules)
        # the package's Whisper rules (suppressed tokens; timestamps when the job has them), by the engine
        options = RequestOptions(output_kind="final_only", whisper_timestamps=bool(job.timestamps))
        return PreparedRequest(None, list(window.prompt), params, None, window.encoder, options=options), False

    def finished(self, window: Window, probe: bool, output: RequestOutput | BaseException) -> list[Window]:
        """A window's request ended (its last output, or the error its driver got): the windows to request
        next (the same one again after its probe or for a retry, a long-form job's next window), none when
        the window ended."""
        job = window.job
        error = output if isinstance(output, BaseException) else output.error
        if error is not None or job.cancelled:
            job.error = job.error or error or CANCELLED
            return self._close(window)
        completion = output.outputs[0]
        if probe:
            window.probed = True
            if output.watched and self.no_speech in output.watched:
                window.no_speech_prob = math.exp(output.watched[self.no_speech])
            if DETECT in window.prompt:
                language = completion.token_ids[0]
                window.prompt[window.prompt.index(DETECT)] = language
                if DETECT in job.init:  # long form: detected once, on the first window
                    job.init[job.init.index(DETECT)] = language
            return [window]
        sampled = list(completion.token_ids)
        ended_by_eos = bool(sampled) and sampled[-1] in self.eos and completion.finish_reason == "stop"
        tokens = sampled[:-1] if ended_by_eos else sampled
        logprob_sum = sum(entry.logprob for entry in completion.logprobs or [])
        fallback, skip = judge(job.decoding, sampled, logprob_sum, window.no_speech_prob, self.vocab_size)
        if fallback and window.attempt + 1 < len(job.decoding.temperatures):
            self.outcomes["retried"] += 1
            window.attempt += 1
            return [window]
        if job.error is not None:
            return self._close(window)
        if job.decoding.word_timestamps and not skip:
            job.timings[window.index] = (tokens, self._token_times(window, tokens, ended_by_eos))
        self.outcomes["skipped" if skip else "kept"] += 1
        job.results[window.index] = [] if skip else tokens
        job.stats[window.index] = WindowStats(int(round(window.offset * 100)), job.decoding.temperatures[window.attempt],
                                              logprob_sum / max(len(sampled), 1), compression_ratio(sampled, self.vocab_size),
                                              window.no_speech_prob or 0.0)
        if job.language is None:
            languages = set(self.language_ids.tolist())
            job.language = next((t for t in window.prompt if t in languages), None)
        job.closed.add(window.index)
        following = self._next(window, tokens, skip)
        if following is not None:
            return [following]
        if job.on_window is not None:
            job.on_window(job)
        return self._close(window)

    @staticmethod
    def _close(window: Window) -> list[Window]:
        window.job.pending -= 1
        return []

    def _next(self, window: Window, tokens: list[int], skip: bool) -> Window | None:
        """Long form: the kept window's segments, the job's seek, and its next window (None at the end)."""
        job = window.job
        if job.features is None:
            return None
        job.condition = job.decoding.condition_on_previous_text and job.decoding.temperatures[window.attempt] < 0.5
        if skip:
            job.seek += window.frames
        else:
            segments, advance = split_segments(tokens, self.rules.begin, window.frames, window.offset)
            for segment in segments:
                segment.window = window.index
            job.segments.extend(segments)
            if window.index in job.timings:  # only the tokens of its segments are kept
                kept = sum(len(s.tokens) for s in segments)
                timed, times = job.timings[window.index]
                job.timings[window.index] = (timed[:kept], times[: kept + 1])
            job.seek += advance if advance > 0 else window.frames  # never stuck on one window
        if job.on_window is not None:
            job.on_window(job)
        if job.seek >= job.num_frames:
            job.on_window = None  # told already
            return None
        return self._next_window(job)

    def _next_window(self, job: Job) -> Window:
        """A long-form job's window at its seek: the features from there (up to the audio's end), and its prompt."""
        features, frames = window_features(job.features[:, : job.num_frames], job.seek, 2 * self.source_positions)
        told = [s for s in job.segments if s.tokens]
        if job.condition and told:
            previous = self.generation.get("prev_sot_token_id")
            limit = self.max_model_len // 2 - 1
            prompt = ([previous] if previous is not None else []) + history(told, self.rules.begin, limit) + job.init
        else:
            prompt = job.prompt_ids + job.init
        job.results.append([])
        return self._window(job, len(job.results) - 1, features, prompt, frames, job.seek * 0.01)

    def _token_times(self, window: Window, tokens: list[int], ended_by_eos: bool) -> list[float]:
        raise NotImplementedError


class WindowJob(Program):
    """A job's windows as a program of the one driver: each window's requests in turn (its probe, its
    attempts, a long-form job's next window); it ends when every window has. A window's failure is its job's
    (the job keeps the first error; the caller raises it), never the other jobs'. `lock`: a window's end runs
    off the event loop on the server, one at a time per transcriber."""

    blocking = True  # word timing runs the alignment graph when a window is kept

    def __init__(self, decoder: WindowDecoder, job: Job, lock: threading.Lock | None = None) -> None:
        self.decoder, self.job = decoder, job
        self.lock = lock or threading.Lock()

    @property
    def complete(self) -> bool:
        return self.job.pending == 0

    def start(self) -> list[tuple[Any, PreparedRequest]]:
        windows, self.job.fresh = self.job.fresh, []
        return [request for window in windows for request in self._requests(window)]

    def advance(self, key: Any, outcome: RequestOutput | BaseException) -> tuple[Handed, list[tuple[Any, PreparedRequest]]]:
        if isinstance(outcome, RequestOutput) and not outcome.finished and outcome.error is None:
            return [], []
        window, probe = key
        return [], self._after(window, probe, outcome)

    def _requests(self, window: Window) -> list[tuple[Any, PreparedRequest]]:
        try:
            prepared, probe = self.decoder.request(window)
        except Exception as exc:  # noqa: BLE001 - this window cannot go on: its job fails, the others do not
            return self._after(window, False, exc)
        return [((window, probe), prepared)]

    def _after(self, window: Window, probe: bool, outcome: RequestOutput | BaseException) -> list[tuple[Any, PreparedRequest]]:
        try:
            with self.lock:
                following = self.decoder.finished(window, probe, outcome)
        except Exception as exc:  # noqa: BLE001 - judging or timing it failed: its job fails alone
            self.job.error = self.job.error or exc
            with self.lock:
                following = self.decoder._close(window)
        return [request for nxt in following for request in self._requests(nxt)]


__all__ = ["CANCELLED", "DETECT", "Job", "Window", "WindowDecoder", "WindowJob", "WindowStats"]
