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

import json
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ortinf.errors import ConfigError, RequestError
from ortinf.manifest import SPEECH_RECOGNITION, Manifest
from ortinf.providers.registry import resolve
from ortinf.providers.session import create_session
from ortinf.runtime.audio_features import SAMPLE_RATE, log_mel
from ortinf.runtime.decoder_graph import DecoderGraph
from ortinf.runtime.model_input import SequenceChunk, build_model_input
from ortinf.runtime.whisper_timestamps import TimestampRules


DETECT = -1  # a prompt's language token, to be detected from the first decoder call


@dataclass(slots=True)
class Job:
    """One audio's windows: their token ids as they come, and who to tell when the last one ends."""

    results: list[list[int]]
    max_new_tokens: int
    on_done: Callable[[Job], None] | None
    windows_left: int
    error: BaseException | None = None
    temperature: float = 0.0  # 0: greedy; else sampled from softmax(logits / temperature) with `generator`
    generator: np.random.Generator | None = None
    timestamps: bool = False  # the model writes timestamp tokens, kept well-formed by TimestampRules


@dataclass(slots=True)
class Window:
    job: Job
    index: int  # within the job
    features: np.ndarray
    tokens: list[int]  # the forced prompt, then what was decoded
    done: int = 0  # tokens already in the pool


class Transcriber:
    """Speech recognition with a Whisper package on a provider whose KV pool is host memory (CPU, OpenVINO)."""

    def __init__(self, package_dir: str | Path, max_windows: int = 8, block_size: int = 16, intra_op_threads: int = 0,
                 provider: str = "cpu") -> None:
        self.package = Path(package_dir)
        self.manifest = Manifest.load(self.package)
        if self.manifest.task != SPEECH_RECOGNITION or self.manifest.speech is None or self.manifest.decoder is None:
            raise ConfigError(f"{package_dir} holds a {self.manifest.task} model, not speech recognition")
        self.speech, spec = self.manifest.speech, self.manifest.decoder
        self.block_size = block_size
        self.cross_blocks = -(-self.speech.source_positions // block_size)
        self.self_blocks = -(-spec.max_model_len // block_size)
        self.max_windows = max_windows
        self._lock = threading.Lock()  # guards the queue: submit() runs on other threads than step()
        self._queue: deque[Window] = deque()
        self._active: dict[int, Window] = {}  # slot -> the window decoding in it
        self._free = list(range(max_windows))  # each slot owns a fixed set of pool blocks
        found = resolve(provider)
        self.graph = DecoderGraph(self.package, max_windows * (self.cross_blocks + self.self_blocks), block_size, found, intra_op_threads)
        if not self.graph.pool.arrays:  # the encoder's cross K/V are written into the pool with numpy
            raise ConfigError(f"speech recognition runs where the KV pool is in host memory (cpu, openvino), not on {found.provider.name} yet")
        self.encoder, _ = create_session(self.package / self.speech.encoder_graph, found, intra_op_threads, spin=False)
        self.mel_filters = np.load(self.package / self.speech.mel_filters)
        path = self.package / "generation_config.json"
        self.generation = json.loads(path.read_text()) if path.is_file() else {}
        self.language_ids = np.array(sorted(self.generation.get("lang_to_id", {}).values()), dtype=np.int64)
        no_timestamps = self.generation.get("no_timestamps_token_id")
        self.rules = (TimestampRules(no_timestamps, self.manifest.eos_token_ids[0], self.generation.get("max_initial_timestamp_index"))
                      if no_timestamps is not None and self.manifest.eos_token_ids else None)
        self.prompt = self._prompt()
        self.eos = set(self.manifest.eos_token_ids)
        self.tokenizer = None
        if (self.package / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(self.package / "tokenizer.json"))

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

    def windows(self, samples: np.ndarray) -> list[np.ndarray]:
        """The log-mel features of each window of 16 kHz mono `samples`."""
        samples = np.asarray(samples, dtype=np.float32)
        if samples.ndim != 1 or samples.size == 0:
            raise RequestError("audio must be a non-empty 1-D array of 16 kHz samples")
        if not np.isfinite(samples).all():  # NaN features would leave NaN K/V in pool blocks the next window reuses
            raise RequestError("the audio holds NaN or infinite samples", param="file")
        size = self.speech.window_samples
        return [log_mel(samples[start : start + size], self.mel_filters, size) for start in range(0, len(samples), size)]

    def transcribe_ids(self, audios: Sequence[np.ndarray], max_new_tokens: int | None = None) -> list[list[int]]:
        """Greedy token ids of each audio (its windows' tokens joined, the forced prompt excluded)."""
        return [[t for window in windows for t in window] for windows in self._decode(audios, max_new_tokens, self.prompt)]

    def transcribe_segments(self, audios: Sequence[np.ndarray], language: str | None = None, task: str = "transcribe",
                            progress: bool = False) -> list[list[str]]:
        """Per audio, the text of each of its 30-second windows; all windows batched together
        (`progress`: a bar on stderr, one step per finished window)."""
        prompt = self._prompt(language, task)
        return [[self._text(ids) for ids in windows] for windows in self._decode(audios, None, prompt, progress)]

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
               timestamps: bool = False) -> Job:
        """Queues one audio's windows (features); `on_done(job)` runs, on the stepping thread, when its
        last window ends. Thread-safe: the server submits from its event loop while a thread steps.
        `temperature` > 0 samples (seeded by `seed`), else greedy."""
        if not 0.0 <= temperature <= 2.0:
            raise RequestError("temperature must be in [0, 2]", param="temperature")
        budget = self.manifest.decoder.max_model_len - len(prompt)
        job = Job([[] for _ in windows], min(max_new_tokens or budget, budget), on_done, len(windows), temperature=temperature,
                  generator=np.random.default_rng(seed) if temperature > 0 else None, timestamps=timestamps)
        with self._lock:
            self._queue.extend(Window(job, index, features, list(prompt)) for index, features in enumerate(windows))
        return job

    @property
    def busy(self) -> bool:
        return bool(self._queue or self._active)

    def step(self) -> int:
        """Admits queued windows into free slots (one encoder call for them), runs one decoder call for
        every active window and ends those that finished; returns how many ended."""
        admitted = []
        with self._lock:
            while self._queue and self._free:
                slot = self._free.pop(0)
                self._active[slot] = window = self._queue.popleft()
                admitted.append((slot, window.features))
        if admitted:
            self._encode(admitted)
        slots = sorted(self._active)
        chunks = [SequenceChunk(self._active[s].tokens[self._active[s].done : self._known(self._active[s])], self._active[s].done,
                                self._self_table(s), cross_blocks=self._cross_table(s), cross_len=self.speech.source_positions)
                  for s in slots]
        logits = self.graph.run(build_model_input(chunks, self.block_size))
        ended = 0
        for row, slot in enumerate(slots):
            window = self._active[slot]
            window.done = self._known(window)
            if window.done < len(window.tokens):  # language detection: the most likely language token
                window.tokens[window.done] = int(self.language_ids[np.argmax(logits[row][self.language_ids])])
                continue
            output = window.job.results[window.index]
            scores = self.rules.apply(logits[row], output) if window.job.timestamps else logits[row]
            token = self._choose(scores, window.job)
            if token not in self.eos and len(output) < window.job.max_new_tokens:
                output.append(token)
                window.tokens.append(token)
            if token in self.eos or len(output) >= window.job.max_new_tokens:
                self._end(slot)
                ended += 1
        return ended

    @staticmethod
    def _choose(row: np.ndarray, job: Job) -> int:
        if job.generator is None:
            return int(np.argmax(row))
        scaled = row.astype(np.float64) / job.temperature
        probs = np.exp(scaled - scaled.max())
        return int(job.generator.choice(len(row), p=probs / probs.sum()))

    @staticmethod
    def _known(window: Window) -> int:
        """How many of the window's tokens are known (all, unless its language is still to detect)."""
        return window.tokens.index(DETECT) if DETECT in window.tokens else len(window.tokens)

    def _end(self, slot: int, error: BaseException | None = None) -> None:
        window = self._active.pop(slot)
        self._free.append(slot)
        job = window.job
        job.windows_left -= 1
        job.error = job.error or error
        if job.windows_left == 0 and job.on_done is not None:
            job.on_done(job)

    def fail_all(self, error: BaseException) -> None:
        """Ends every queued and active window with `error` (a failed step): each job reports once."""
        with self._lock:
            queued, self._queue = list(self._queue), deque()
        for slot in list(self._active):
            self._end(slot, error)
        for window in queued:
            window.job.windows_left -= 1
            window.job.error = window.job.error or error
            if window.job.windows_left == 0 and window.job.on_done is not None:
                window.job.on_done(window.job)

    def _cross_table(self, slot: int) -> list[int]:
        first = slot * (self.cross_blocks + self.self_blocks)
        return list(range(first, first + self.cross_blocks))

    def _self_table(self, slot: int) -> list[int]:
        first = slot * (self.cross_blocks + self.self_blocks) + self.cross_blocks
        return list(range(first, first + self.self_blocks))

    def _encode(self, admitted: list[tuple[int, np.ndarray]]) -> None:
        """One encoder call for the newly admitted windows; their cross K/V into their blocks."""
        cross = self.encoder.run(None, {"input_features": np.stack([f for _, f in admitted])})
        positions = np.arange(self.speech.source_positions)
        for row, (slot, _) in enumerate(admitted):
            table = np.array(self._cross_table(slot))
            slots = table[positions // self.block_size] * self.block_size + positions % self.block_size
            self.graph.pool.write(slots, [layer[row] for layer in cross])

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
        size = self.speech.window_samples / SAMPLE_RATE
        return [(start, end, self._text(ids)) for index, tokens in enumerate(job.results)
                for start, end, ids in self.rules.segments(tokens, offset=index * size)]


__all__ = ["SAMPLE_RATE", "Transcriber"]
