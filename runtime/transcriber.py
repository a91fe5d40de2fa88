"""Transcriber: a Whisper package's encoder and paged decoder, many audio windows decoded together.

Each 30-second window is one sequence: the encoder runs once for a batch of windows and its
cross-attention K/V go into pool blocks of the window's own (exporter/whisper.py explains why the
pool); then every active window advances one token per decoder call, greedy, through the same
DecoderGraph as the text decoders, and a window that finishes frees its blocks for the next one.

Status (issue 23, in progress): greedy decoding from the decoder's start token (and the language and
task tokens when the package's generation config names them), no timestamps; audio longer than a
window is cut into windows decoded independently (without the previous window's text as prompt).
Requests submit their windows (`submit`) and a loop calls `step`: runtime/async_transcriber.py
drives it for the server, so concurrent requests' windows decode together. The text engine's
scheduler (chunked prefill, preemption, prefix caching keyed by audio) is not used yet.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ortinf.errors import ConfigError, RequestError
from ortinf.manifest import SPEECH_RECOGNITION, Manifest
from ortinf.providers.registry import resolve
from ortinf.providers.session import create_session
from ortinf.runtime.audio_features import HOP_LENGTH, SAMPLE_RATE, log_mel
from ortinf.runtime.decoder_graph import DecoderGraph
from ortinf.runtime.longform import Decoding, Segment, history, judge, split_segments, window_features
from ortinf.runtime.model_input import SequenceChunk, build_model_input
from ortinf.runtime.whisper_timestamps import TimestampRules
from ortinf.runtime.window_blocks import Held, WindowBlocks, audio_key
from ortinf.runtime.word_timing import token_times, words


DETECT = -1  # a prompt's language token, to be detected from the first decoder call
CANCELLED = RequestError("the transcription was cancelled")
# Windows per encoder call. Batching windows does not make the encoder cheaper per window (its cost is
# its MatMuls over 1500 positions), and past a few the [B, heads, 1500, 1500] score tensors spill the
# caches: whisper-tiny's encoder on 2 AVX-512 cores took 235, 244, 240 and 313 ms per window at
# batches of 1, 2, 4 and 10.
ENCODER_BATCH = 4


@dataclass(slots=True)
class Job:
    """One audio: its decoding options, each window's tokens as they end, and who to tell when it is done.
    Two kinds: fixed 30-second windows decoded side by side (`submit`), or windows one after another, each
    starting where the last one's timestamps end and prompted with its text (`submit_long`: `features` set)."""

    decoding: Decoding
    on_done: Callable[[Job], None] | None
    results: list[list[int]]  # each window's tokens (the kept attempt; [] for a skipped window)
    pending: int  # windows queued or decoding
    max_new_tokens: int | None = None
    error: BaseException | None = None
    generator: np.random.Generator | None = None
    features: np.ndarray | None = None  # long form: the whole audio's log-mel, windows cut from it at `seek`
    seek: int = 0  # frames
    segments: list[Segment] = field(default_factory=list)
    init: list[int] = field(default_factory=list)  # long form: start, language, task (no-timestamps)
    prompt_ids: list[int] = field(default_factory=list)  # long form: <|startofprev|> and the request's prompt
    condition: bool = False  # the next window is prompted with the text so far
    on_window: Callable[[Job], None] | None = None  # runs, on the stepping thread, each time a window is kept
    closed: set[int] = field(default_factory=set)  # the windows kept so far
    cancelled: bool = False  # its caller went away: its windows end at the next step
    timings: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)  # window -> kept tokens, their times (s)

    @property
    def timestamps(self) -> bool:
        return self.decoding.timestamps


@dataclass(slots=True)
class Window:
    job: Job
    index: int  # within the job
    features: np.ndarray
    prompt: list[int]  # the forced tokens (DETECT where the language is still to find)
    tokens: list[int]  # the prompt, then what was decoded
    sot: int = 0  # where the start-of-transcript token is in the prompt
    stop: int | None = None  # a position whose logits are needed before the prompt goes on (language, no-speech)
    done: int = 0  # tokens already in the pool
    attempt: int = 0  # which of the decoding's temperatures
    logprob_sum: float = 0.0
    no_speech_prob: float | None = None
    held: Held | None = None  # its pool blocks (runtime/window_blocks.py), while admitted
    frames: int = 0  # real feature frames in the window
    offset: float = 0.0  # seconds into the audio


class Transcriber:
    """Speech recognition with a Whisper package: on the CPU and OpenVINO (host pools), and on device
    providers (WebGPU, CUDA), whose pools the encoder graph writes in place."""

    def __init__(self, package_dir: str | Path, max_windows: int = 8, block_size: int = 16, intra_op_threads: int = 0,
                 provider: str = "cpu", num_blocks: int | None = None, enable_prefix_caching: bool = True) -> None:
        self.package = Path(package_dir)
        self.manifest = Manifest.load(self.package)
        if self.manifest.task != SPEECH_RECOGNITION or self.manifest.speech is None or self.manifest.decoder is None:
            raise ConfigError(f"{package_dir} holds a {self.manifest.task} model, not speech recognition")
        self.speech, spec = self.manifest.speech, self.manifest.decoder
        cross_blocks = -(-self.speech.source_positions // block_size)
        one_window = cross_blocks + -(-spec.max_model_len // block_size)
        num_blocks = num_blocks or max_windows * one_window  # by default no window is ever preempted
        if num_blocks < one_window:
            raise ConfigError(f"num_blocks must hold one whole window: at least {one_window} blocks of {block_size}")
        self.max_windows = max_windows
        self._lock = threading.Lock()  # guards the queue: submit() runs on other threads than step()
        self._queue: deque[Window] = deque()
        self._active: dict[int, Window] = {}  # admission number -> the window, oldest first
        self._order = itertools.count()
        self.blocks = WindowBlocks(num_blocks, block_size, cross_blocks, enable_prefix_caching)
        self.preemptions = self.encoded_windows = 0
        self.outcomes = {"kept": 0, "retried": 0, "skipped": 0}  # windows, for metrics
        found = resolve(provider)
        self.found, self.intra_op_threads, self.alignment = found, intra_op_threads, None
        self.graph = DecoderGraph(self.package, num_blocks, block_size, found, intra_op_threads)
        # a host pool gets the encoder's cross K/V written by numpy; a device pool (WebGPU, CUDA) by the
        # encoder graph itself, in place (exporter/whisper.py pool_write_encoder)
        self.device_pool = not self.graph.pool.arrays
        if self.device_pool and not self.speech.encoder_write_graph:
            raise ConfigError(f"{package_dir} predates speech on device providers ({found.provider.name}): re-export it with this ortinf")
        encoder = self.speech.encoder_write_graph if self.device_pool else self.speech.encoder_graph
        self.encoder, _ = create_session(self.package / encoder, found, intra_op_threads, spin=False)
        self.mel_filters = np.load(self.package / self.speech.mel_filters)
        path = self.package / "generation_config.json"
        self.generation = json.loads(path.read_text()) if path.is_file() else {}
        self.language_ids = np.array(sorted(self.generation.get("lang_to_id", {}).values()), dtype=np.int64)
        no_timestamps = self.generation.get("no_timestamps_token_id")
        self.rules = (TimestampRules(no_timestamps, self.manifest.eos_token_ids[0], self.generation.get("max_initial_timestamp_index"))
                      if no_timestamps is not None and self.manifest.eos_token_ids else None)
        self.prompt = self._prompt()
        self.eos = set(self.manifest.eos_token_ids)
        # what transformers' generate suppresses always, and at the first sampled token (ids past the vocabulary ignored)
        vocab = self.manifest.decoder.vocab_size
        self.suppress = np.array([t for t in self.generation.get("suppress_tokens") or [] if t < vocab], dtype=np.int64)
        self.begin_suppress = np.array([t for t in self.generation.get("begin_suppress_tokens") or [] if t < vocab], dtype=np.int64)
        self.no_speech = no_timestamps - 1 if no_timestamps is not None else None  # <|nospeech|>, before <|notimestamps|>
        self.vocab_size = self.manifest.decoder.vocab_size
        self.tokenizer = None
        if (self.package / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(self.package / "tokenizer.json"))
        added = self.tokenizer.get_added_tokens_decoder() if self.tokenizer is not None else {}
        self.special = {i for i, token in added.items() if token.special} | set(self.eos)

    def _prompt(self, language: str | None = None, task: str = "transcribe", text: str | None = None,
                timestamps: bool = False) -> list[int]:
        """The forced start: the decoder's start token, then language, task and no-timestamps where the
        generation config names them (multilingual checkpoints). With no language given, a multilingual
        model's language is detected per window (DETECT in its place: step() fills it in). `text`, a
        prompt (OpenAI's `prompt`: spellings, context), goes before them behind <|startofprev|>, its
        last half-context of tokens, as transformers' prompt_ids do."""
        prompt = [self.speech.decoder_start_token_id]
        if text:
            previous = self.generation.get("prev_sot_token_id")
            if previous is None or self.tokenizer is None:
                raise RequestError("this model takes no prompt (its generation config has no prev_sot_token_id)", param="prompt")
            ids = self.tokenizer.encode(" " + text.strip(), add_special_tokens=False).ids
            prompt = [previous, *ids[-(self.manifest.decoder.max_model_len // 2 - 1):], *prompt]
        config = self.generation
        if config.get("is_multilingual") and language is not None:
            token = config.get("lang_to_id", {}).get(f"<|{language}|>")
            if token is None:
                raise RequestError(f"unknown language '{language}'", param="language")
            prompt.append(token)
        elif config.get("is_multilingual") and config.get("lang_to_id"):
            prompt.append(DETECT)
        if config.get("is_multilingual") and "task_to_id" in config:
            prompt.append(config["task_to_id"][task])
        elif task != "transcribe":
            raise RequestError("this model is English-only: it transcribes, it does not translate", param="model")
        if timestamps and self.rules is None:
            raise RequestError("this model has no timestamp tokens (its generation config names no no_timestamps_token_id)",
                               param="timestamp_granularities[]")
        if "no_timestamps_token_id" in config and not timestamps:
            prompt.append(config["no_timestamps_token_id"])
        return prompt

    def window_frames(self, samples: np.ndarray) -> list[int]:
        """The real feature frames of each fixed window of `samples` (word timing ignores the padding)."""
        size = self.speech.window_samples
        return [-(-min(size, len(samples) - start) // HOP_LENGTH) for start in range(0, len(samples), size)]

    def windows(self, samples: np.ndarray) -> list[np.ndarray]:
        """The log-mel features of each window of 16 kHz mono `samples`."""
        samples = self._check(samples)
        size = self.speech.window_samples
        return [log_mel(samples[start : start + size], self.mel_filters, size) for start in range(0, len(samples), size)]

    @staticmethod
    def _check(samples: np.ndarray) -> np.ndarray:
        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim != 1 or samples.size == 0:
            raise RequestError("audio must be a non-empty 1-D array of 16 kHz samples")
        if not np.isfinite(samples).all():  # NaN features would leave NaN K/V in pool blocks the next window reuses
            raise RequestError("the audio holds NaN or infinite samples", param="file")
        return samples

    def transcribe_ids(self, audios: Sequence[np.ndarray], max_new_tokens: int | None = None) -> list[list[int]]:
        """Greedy token ids of each audio (its windows' tokens joined, the forced prompt excluded)."""
        return [[t for window in windows for t in window] for windows in self._decode(audios, max_new_tokens, self.prompt)]

    def transcribe_segments(self, audios: Sequence[np.ndarray], language: str | None = None, task: str = "transcribe",
                            progress: bool = False) -> list[list[str]]:
        """Per audio, the text of each of its 30-second windows; all windows batched together
        (`progress`: a bar on stderr, one step per finished window)."""
        prompt = self._prompt(language, task)
        return [[self._text(ids) for ids in windows] for windows in self._decode(audios, None, prompt, progress)]

    def run(self, audios: Sequence[np.ndarray], decoding: Decoding, language: str | None = None, task: str = "transcribe",
            progress: bool = False) -> list[Job]:
        """Every audio decoded to the end, together: window after window when `decoding.timestamps`, else
        its fixed windows side by side (`progress`: a bar on stderr in seconds of audio)."""
        from tqdm.auto import tqdm

        if decoding.timestamps:
            forced = self._prompt(language, task, timestamps=True)
            jobs = [self.submit_long(audio, forced, decoding) for audio in audios]
        else:
            forced = self._prompt(language, task)
            jobs = [self.submit(self.windows(audio), forced, decoding=decoding) for audio in audios]
        total = sum(len(audio) for audio in audios) / SAMPLE_RATE
        bar = tqdm(total=round(total), desc="audio seconds", disable=not progress)
        while self.busy:
            self.step()
            bar.update(round(min(total, sum(self.progress(job) for job in jobs))) - bar.n)
        bar.close()
        for job in jobs:
            if job.error is not None:
                raise job.error
        return jobs

    def progress(self, job: Job) -> float:
        """Seconds of a job's audio decoded so far."""
        if job.features is not None:
            return job.seek * 0.01
        return len(job.closed) * self.speech.window_samples / SAMPLE_RATE

    def segments(self, job: Job, duration: float) -> list[tuple[float, float, str]]:
        """(start, end, text) of a finished job: its timestamped segments, or its windows."""
        if job.timestamps:
            return self.timed_segments(job)
        size = self.speech.window_samples / SAMPLE_RATE
        return [(i * size, min((i + 1) * size, duration), self._text(ids)) for i, ids in enumerate(job.results)]

    def _decode(self, audios: Sequence[np.ndarray], max_new_tokens: int | None, prompt: list[int],
                progress: bool = False) -> list[list[list[int]]]:
        """Greedy token ids of each window of each audio: every window submitted, then steps until done."""
        from tqdm.auto import tqdm

        jobs = [self.submit(self.windows(audio), prompt, max_new_tokens) for audio in audios]
        bar = tqdm(total=sum(len(job.results) for job in jobs), desc="windows", disable=not progress)
        while self.busy:
            bar.update(self.step())
        bar.close()
        return [job.results for job in jobs]

    def submit(self, windows: list[np.ndarray], prompt: list[int], max_new_tokens: int | None = None,
               on_done: Callable[[Job], None] | None = None, temperature: float = 0.0, seed: int | None = None,
               timestamps: bool = False, decoding: Decoding | None = None,
               on_window: Callable[[Job], None] | None = None, frames: list[int] | None = None) -> Job:
        """Queues one audio's fixed windows (features), decoded side by side; `on_done(job)` runs, on the
        stepping thread, when its last window ends. Thread-safe: the server submits from its event loop
        while a thread steps. `temperature` > 0 samples (seeded by `seed`), else greedy; `decoding`, when
        given, replaces those three (and adds the fallback rules)."""
        decoding = decoding or Decoding(max_new_tokens, (temperature,), seed, timestamps)
        job = self._job(decoding, on_done, len(windows))
        job.on_window = on_window
        frames = frames or [2 * self.speech.source_positions] * len(windows)
        size = self.speech.window_samples / SAMPLE_RATE
        with self._lock:
            self._queue.extend(self._window(job, index, features, list(prompt), frames[index], index * size)
                               for index, features in enumerate(windows))
        return job

    def submit_long(self, samples: np.ndarray, prompt: list[int], decoding: Decoding,
                    on_done: Callable[[Job], None] | None = None, prompt_ids: list[int] | None = None,
                    on_window: Callable[[Job], None] | None = None) -> Job:
        """Queues one audio decoded window after window, as transformers' long-form generate does
        (runtime/longform.py): each window starts where the last one's timestamps end, and with
        `decoding.condition_on_previous_text` is prompted with the text so far. `prompt` is the forced
        start (with timestamps: no <|notimestamps|>); `prompt_ids`, <|startofprev|> and the request's own
        prompt, goes before it until the text so far takes its place."""
        if self.rules is None:
            raise RequestError("this model has no timestamp tokens, so long audio is cut into fixed windows", param="response_format")
        if not decoding.timestamps:
            raise RequestError("window-after-window decoding needs timestamps", param="timestamp_granularities[]")
        samples = self._check(samples)
        size = self.speech.window_samples
        features = log_mel(samples, self.mel_filters, max(len(samples), size)) if len(samples) > size else log_mel(samples, self.mel_filters)
        job = self._job(decoding, on_done, 0)
        job.features, job.init, job.prompt_ids = features, list(prompt), list(prompt_ids or [])
        job.condition, job.on_window = decoding.condition_on_previous_text, on_window
        if job.prompt_ids:  # the request's prompt is the first "segment" of the history (transformers' first-segment)
            job.segments.append(Segment(0.0, 0.0, job.prompt_ids[1:]))
        with self._lock:
            self._queue.append(self._next_window(job))
        return job

    def _job(self, decoding: Decoding, on_done: Callable[[Job], None] | None, windows: int) -> Job:
        decoding.check()
        sampled = any(t > 0 for t in decoding.temperatures)
        return Job(decoding, on_done, [[] for _ in range(windows)], max(windows, 1), decoding.max_new_tokens,
                   generator=np.random.default_rng(decoding.seed) if sampled else None)

    def _window(self, job: Job, index: int, features: np.ndarray, prompt: list[int], frames: int = 0, offset: float = 0.0) -> Window:
        sot = len(prompt) - 1 - prompt[::-1].index(self.speech.decoder_start_token_id)
        measure = DETECT in prompt or job.decoding.no_speech_threshold is not None
        return Window(job, index, features, prompt, list(prompt), sot=sot, stop=sot + 1 if measure else None,
                      frames=frames, offset=offset)

    def _next_window(self, job: Job) -> Window:
        """A long-form job's window at its seek: the features from there, and its prompt."""
        features, frames = window_features(job.features, job.seek, 2 * self.speech.source_positions)
        told = [s for s in job.segments if s.tokens]
        if job.condition and told:
            previous = self.generation.get("prev_sot_token_id")
            limit = self.manifest.decoder.max_model_len // 2 - 1
            prompt = ([previous] if previous is not None else []) + history(told, self.rules.begin, limit) + job.init
        else:
            prompt = job.prompt_ids + job.init
        job.results.append([])
        return self._window(job, len(job.results) - 1, features, prompt, frames, job.seek * 0.01)

    def stats(self) -> dict[str, float]:
        """Running totals and gauges for metrics: windows kept, retried hotter and skipped as silence,
        preemptions, windows whose encoder output the pool held, and the pool's use. Read from any
        thread (plain numbers: a scrape may see a step half counted)."""
        return {**self.outcomes, "preemptions": self.preemptions, "encoder_cache_hits": self.blocks.cross_hits,
                "kv_cache_usage": self.blocks.pool.usage()}

    @property
    def busy(self) -> bool:
        return bool(self._queue or self._active)

    def step(self) -> int:
        """Admits queued windows while the pool has room (one encoder call for those whose audio it does
        not hold), grows every active window's blocks (preempting the latest admitted when short), runs one decoder call for
        every active window and ends those that finished; returns how many ended."""
        ended = 0
        with self._lock:  # admission in order while the pool has room (the text scheduler's first-come rule)
            while self._queue and len(self._active) < self.max_windows:
                window = self._queue[0]
                if window.job.cancelled:
                    self._queue.popleft()
                    window.job.error = window.job.error or CANCELLED
                    self._finish(window.job)
                    continue
                window.held = window.held or Held(audio_key(window.features))
                hit = self.blocks.admit(window.held, window.tokens, self._known(window))
                if hit is None:
                    break
                self._queue.popleft()
                window.done = hit
                self._active[next(self._order)] = window
        for key in [key for key, window in self._active.items() if window.job.cancelled]:
            ended += self._end(key, CANCELLED)
        fresh = [window for window in self._active.values() if not window.held.encoded]
        if fresh:
            self._encode(fresh)
        for key in list(self._active):  # oldest first; the pool short: the latest admitted goes back to the queue
            while key in self._active and not self.blocks.grow(self._active[key].held, self._known(self._active[key])):
                self._preempt(max(self._active))
        if not self._active:
            return ended
        keys = list(self._active)
        chunks = []
        for key in keys:
            window = self._active[key]
            chunks.append(SequenceChunk(window.tokens[window.done : self._known(window)], window.done,
                                        [b.block_id for b in window.held.blocks], cross_blocks=[b.block_id for b in window.held.cross],
                                        cross_len=self.speech.source_positions))
        logits = self.graph.run(build_model_input(chunks, self.blocks.block_size))
        for row, key in enumerate(keys):
            window = self._active[key]
            window.done = self._known(window)
            self.blocks.cache(window.held, window.tokens, window.done)
            if window.stop == window.done:  # the logits after the start token: no-speech, the language
                window.stop = None
                if window.job.decoding.no_speech_threshold is not None and self.no_speech is not None:
                    window.no_speech_prob = float(_softmax(logits[row])[self.no_speech])
                if window.done < len(window.tokens):
                    window.tokens[window.done] = language = int(self.language_ids[np.argmax(logits[row][self.language_ids])])
                    if DETECT in window.job.init:  # long form: detected once, on the first window
                        window.job.init[window.job.init.index(DETECT)] = language
                    continue
            ended += self._advance(key, window, logits[row])
        return ended

    def _preempt(self, key: int) -> None:
        """Back to the head of the queue with its tokens: its blocks are freed (still hashed, so its
        audio and prefix are usually found again), and it recomputes from there when readmitted."""
        window = self._active.pop(key)
        self.blocks.free(window.held)
        window.done = 0
        self.preemptions += 1
        with self._lock:
            self._queue.appendleft(window)

    def _advance(self, key: int, window: Window, logits: np.ndarray) -> int:
        """Samples the window's next token; 1 when that ended the window (EOS or its token budget)."""
        job = window.job
        output = window.tokens[len(window.prompt):]
        scores = logits.astype(np.float32, copy=True)
        if self.suppress.size:
            scores[self.suppress] = -np.inf
        if not output and self.begin_suppress.size:
            scores[self.begin_suppress] = -np.inf
        if job.timestamps:
            scores = self.rules.apply(scores, output)
        temperature = job.decoding.temperatures[window.attempt]
        if temperature > 0:
            token = int(job.generator.choice(len(scores), p=_softmax(scores / temperature)))
        else:
            token = int(np.argmax(scores))
        window.logprob_sum += float(np.log(_softmax(scores)[token]))
        budget = self.manifest.decoder.max_model_len - len(window.prompt)
        budget = min(job.max_new_tokens or budget, budget)
        if token not in self.eos and len(output) < budget:
            window.tokens.append(token)
            output.append(token)
        if token in self.eos or len(output) >= budget:
            return self._end(key, ended_by_eos=token in self.eos)
        return 0

    @staticmethod
    def _known(window: Window) -> int:
        """How many of the window's tokens go into the next call: up to a position whose logits are
        needed first (language detection, the no-speech probability), else all."""
        return window.stop if window.stop is not None and window.done < window.stop else len(window.tokens)

    def _end(self, key: int, error: BaseException | None = None, ended_by_eos: bool = False) -> int:
        """Ends an active window: retried at the next temperature if the fallback rules ask (0 returned,
        the window keeps its blocks: encoder output and prompt K/V), else kept, and a long-form job's next
        window queued."""
        window = self._active[key]
        job = window.job
        output = window.tokens[len(window.prompt):]
        fallback = skip = False
        if error is None:
            sampled = output + ([self.manifest.eos_token_ids[0]] if ended_by_eos else [])
            fallback, skip = judge(job.decoding, sampled, window.logprob_sum, window.no_speech_prob, self.vocab_size)
            if fallback and window.attempt + 1 < len(job.decoding.temperatures):
                self.outcomes["retried"] += 1
                window.attempt += 1
                window.tokens, window.logprob_sum = list(window.prompt), 0.0
                window.done = self.blocks.retry(window.held, len(window.prompt))
                return 0
        if error is None and not skip and job.decoding.word_timestamps:  # before its blocks (its cross K/V) are freed
            job.timings[window.index] = (output, self._token_times(window, ended_by_eos))
        del self._active[key]
        self.blocks.free(window.held)
        if error is None:
            self.outcomes["skipped" if skip else "kept"] += 1
        job.error = job.error or error
        job.results[window.index] = [] if skip else output
        job.closed.add(window.index)
        if job.features is not None and job.error is None:
            job.condition = job.decoding.condition_on_previous_text and job.decoding.temperatures[window.attempt] < 0.5
            if skip:
                job.seek += window.frames
            else:
                segments, advance = split_segments(output, self.rules.begin, window.frames, window.offset)
                job.segments.extend(segments)
                if window.index in job.timings:  # only the tokens of its segments are kept
                    kept = sum(len(s.tokens) for s in segments)
                    tokens, times = job.timings[window.index]
                    job.timings[window.index] = (tokens[:kept], times[: kept + 1])
                job.seek += advance if advance > 0 else window.frames  # never stuck on one window
            if job.on_window is not None:
                job.on_window(job)
            if job.seek < job.features.shape[1]:
                with self._lock:
                    self._queue.appendleft(self._next_window(job))
                return 1
        elif job.on_window is not None and job.error is None:
            job.on_window(job)
        self._finish(job)
        return 1

    def committed(self, job: Job) -> list[str]:
        """The texts a job has kept so far, in order: its segments (long form), or its windows up to the
        first one still decoding. Nothing here changes later."""
        if job.features is not None:
            return [text for _, _, text in self.timed_segments(job)]
        kept = []
        for index in range(len(job.results)):
            if index not in job.closed:
                break
            kept.append(self._text(job.results[index]))
        return kept

    @staticmethod
    def _finish(job: Job) -> None:
        job.pending -= 1
        if job.pending == 0 and job.on_done is not None:
            job.on_done(job)

    @staticmethod
    def cancel(job: Job) -> None:
        """Stops a job whose caller went away (thread-safe): its windows end at the next step."""
        job.cancelled = True

    def fail_all(self, error: BaseException) -> None:
        """Ends every queued and active window with `error` (a failed step): each job reports once."""
        with self._lock:
            queued, self._queue = list(self._queue), deque()
        for key in list(self._active):
            self._end(key, error)
        for window in queued:
            window.job.error = window.job.error or error
            self._finish(window.job)

    def _token_times(self, window: Window, ended_by_eos: bool) -> list[float]:
        """Seconds into the audio of each decoded token of a kept window, and of the end after the last
        one (runtime/word_timing.py): the alignment graph over its tokens and its cross K/V as they sit
        in its pool blocks."""
        if self.alignment is None:
            if not self.speech.alignment_graph:
                raise RequestError("this package has no alignment graph for word timestamps: re-export it with this ortinf",
                                   param="timestamp_granularities[]")
            self.alignment, _ = create_session(self.package / self.speech.alignment_graph, self.found, self.intra_op_threads, spin=False)
        prompt = len(window.prompt)
        output = len(window.tokens) - prompt
        rows = prompt + (output if ended_by_eos else max(output - 1, 0))  # the last token sampled was never fed
        table = np.array([b.block_id for b in window.held.cross])
        feeds = {"input_ids": np.array(window.tokens[:rows], dtype=np.int64)}
        wanted = {i.name for i in self.alignment.get_inputs()}
        for index in range(len(self.graph.pool.values)):
            name = f"cross_{'key' if index % 2 == 0 else 'value'}.{index // 2}"
            if name not in wanted:  # past the last alignment layer (and its V, which no weight needs)
                continue
            array = self.graph.pool.arrays[index] if self.graph.pool.arrays else self.graph.pool.read(index)  # a device pool: a host copy
            heads, _, size, width = array.shape
            feeds[name] = np.ascontiguousarray(
                array[:, table].reshape(heads, -1, width)[:, : self.speech.source_positions])
        weights = self.alignment.run(None, feeds)[0]
        times = token_times(weights, prompt, window.frames, self.speech.median_filter_width)
        end = prompt + output + (1 if ended_by_eos else 0)
        padded = np.concatenate([times, np.repeat(times[-1:], max(end + 1 - len(times), 0))])
        return (window.offset + padded[prompt : prompt + output + 1]).tolist()

    def words(self, job: Job) -> list[tuple[str, float, float]]:
        """(word, start, end) of a finished word-timestamps job, in seconds into its audio."""
        found = []
        for index in sorted(job.timings):  # a word never spans two windows
            tokens, times = job.timings[index]
            found += words([(self.tokenizer.decode([token], skip_special_tokens=False), times[k], times[k + 1])
                            for k, token in enumerate(tokens)
                            if token < (self.rules.begin if self.rules else self.vocab_size) and token not in self.special])
        return found

    def _encode(self, windows: list[Window]) -> None:
        """One encoder call for the newly admitted windows whose audio the pool does not hold; their
        cross K/V into their cross blocks."""
        positions = np.arange(self.speech.source_positions)
        size = self.blocks.block_size
        for first in range(0, len(windows), ENCODER_BATCH):
            batch = windows[first : first + ENCODER_BATCH]
            features = np.ascontiguousarray(np.stack([w.features for w in batch]))
            if self.device_pool:  # the graph writes each window's cross K/V into its blocks, on the device
                binding = self.encoder.io_binding()
                binding.bind_cpu_input("input_features", features)
                tables = [np.array([b.block_id for b in w.held.cross]) for w in batch]
                binding.bind_cpu_input("slot_mapping", np.concatenate([t[positions // size] * size + positions % size for t in tables]))
                self.graph.pool.bind(binding)
                self.encoder.run_with_iobinding(binding)
                for window in batch:
                    self.blocks.encoded(window.held)
                continue
            cross = self.encoder.run(None, {"input_features": features})
            for row, window in enumerate(batch):
                table = np.array([b.block_id for b in window.held.cross])
                self.graph.pool.write(table[positions // size] * size + positions % size, [layer[row] for layer in cross])
                self.blocks.encoded(window.held)
        self.encoded_windows += len(windows)

    def transcribe(self, audios: Sequence[np.ndarray], max_new_tokens: int | None = None) -> list[str]:
        """The text of each audio (16 kHz mono float samples): its windows' texts joined by a space."""
        return [" ".join(t for t in (self._text(ids) for ids in windows) if t)
                for windows in self._decode(audios, max_new_tokens, self.prompt)]

    def _text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            raise ConfigError(f"{self.package} has no tokenizer: use transcribe_ids()")
        if self.rules is not None:
            ids = [t for t in ids if t < self.rules.begin]  # timestamp tokens are not text
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def timed_segments(self, job: Job) -> list[tuple[float, float, str]]:
        """(start, end, text) of each timestamped segment of a finished timestamps job, over all its windows."""
        if job.features is not None:  # long form: the segments as the windows were cut (the request's prompt is not one)
            told = job.segments[1:] if job.prompt_ids else job.segments
            return [(s.start, s.end, self._text(s.tokens)) for s in told]
        size = self.speech.window_samples / SAMPLE_RATE
        return [(start, end, self._text(ids)) for index, tokens in enumerate(job.results)
                for start, end, ids in self.rules.segments(tokens, offset=index * size)]


def _softmax(row: np.ndarray) -> np.ndarray:
    shifted = np.exp(row.astype(np.float64) - np.max(row))
    return shifted / shifted.sum()


__all__ = ["SAMPLE_RATE", "Decoding", "Transcriber"]
