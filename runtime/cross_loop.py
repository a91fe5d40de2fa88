"""CrossDecoderLoop: sequences decoded over cross-attention K/V of their own, many at once, for the
encoder-decoders (Whisper: runtime/transcriber.py; Marian and BART now run on the text engine: runtime/engine.py).

Each sequence (a Whisper window, a source sentence) is a Window: the encoder runs once for it and
its cross-attention K/V go into pool blocks of its own (exporter/whisper.py explains why the pool);
then every active window advances one token per decoder call through the same DecoderGraph as the
text decoders. A loop of `step()` calls:
1. admits queued windows in order while the pool has room and fewer than `max_windows` decode;
2. runs the encoder for those whose input the pool does not hold (runtime/window_blocks.py caches the
   cross blocks by a digest of the encoder's input);
3. grows every window's self-attention blocks, preempting the latest admitted window when short;
4. runs one decoder call, then samples each window's next token (suppressed tokens, Whisper's
   timestamp rules, a temperature), and ends the windows that finished: kept, or retried at the next
   temperature when the decoding's fallback rules ask (runtime/longform.py judge).
Subclasses say what the encoder takes (`_encoder_feeds`) and what happens to a kept window
(`_before_free`, `_kept`).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ortinf.errors import ConfigError, RequestError
from ortinf.manifest import Manifest
from ortinf.providers.registry import resolve
from ortinf.providers.session import create_session
from ortinf.runtime.decoder_graph import DecoderGraph
from ortinf.runtime.longform import Decoding, Segment, judge
from ortinf.runtime.model_input import SequenceChunk, build_model_input
from ortinf.runtime.sampling_params import GREEDY_BELOW
from ortinf.runtime.window_blocks import Held, WindowBlocks, audio_key


DETECT = -1  # a prompt's language token, to be detected from the first decoder call
CANCELLED = RequestError("the request was cancelled")
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
    cross_len: int = 0  # encoder positions its cross blocks hold (Whisper: 1500; text: the source's length)
    offset: float = 0.0  # seconds into the audio


class CrossDecoderLoop:
    """The shared loop; a subclass's __init__ calls `_setup`."""

    rules = None  # Whisper's TimestampRules when the model has timestamp tokens
    no_speech: int | None = None  # Whisper's <|nospeech|>
    language_ids = np.zeros(0, dtype=np.int64)  # Whisper's language tokens (DETECT)

    def _setup(self, package_dir: str | Path, manifest: Manifest, cross_positions: int, encoder_graph: str,
               encoder_write_graph: str | None, decoder_start: int, max_windows: int, block_size: int, provider: str,
               intra_op_threads: int, num_blocks: int | None, enable_prefix_caching: bool) -> None:
        self.package, self.manifest, spec = Path(package_dir), manifest, manifest.decoder
        self.decoder_start = decoder_start
        cross_blocks = -(-cross_positions // block_size)
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
        self.found, self.intra_op_threads = found, intra_op_threads
        self.graph = DecoderGraph(self.package, num_blocks, block_size, found, intra_op_threads)
        # a host pool gets the encoder's cross K/V written by numpy; a device pool (WebGPU, CUDA) by the
        # encoder graph itself, in place (exporter/whisper.py pool_write_encoder)
        self.device_pool = not self.graph.pool.arrays
        if self.device_pool and not encoder_write_graph:
            raise ConfigError(f"{package_dir} has no encoder graph that writes a device pool ({found.provider.name}): "
                              "re-export it with this ortinf, or run it on the cpu or openvino")
        encoder = encoder_write_graph if self.device_pool else encoder_graph
        self.encoder, _ = create_session(self.package / encoder, found, intra_op_threads, spin=False)
        path = self.package / "generation_config.json"
        self.generation = json.loads(path.read_text()) if path.is_file() else {}
        self.eos = set(self.manifest.eos_token_ids)
        # what transformers' generate suppresses always, and at the first sampled token (ids past the vocabulary ignored)
        vocab = self.vocab_size = spec.vocab_size
        banned = [w[0] for w in self.generation.get("bad_words_ids") or [] if len(w) == 1]  # Marian: never the pad token
        self.suppress = np.array([t for t in (self.generation.get("suppress_tokens") or []) + banned if t < vocab], dtype=np.int64)
        self.begin_suppress = np.array([t for t in self.generation.get("begin_suppress_tokens") or [] if t < vocab], dtype=np.int64)
        self.tokenizer = None
        if (self.package / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(self.package / "tokenizer.json"))
        added = self.tokenizer.get_added_tokens_decoder() if self.tokenizer is not None else {}
        self.special = {i for i, token in added.items() if token.special} | set(self.eos)

    def submit(self, windows: list[np.ndarray], prompt: list[int], max_new_tokens: int | None = None,
               on_done: Callable[[Job], None] | None = None, temperature: float = 0.0, seed: int | None = None,
               timestamps: bool = False, decoding: Decoding | None = None,
               on_window: Callable[[Job], None] | None = None, frames: list[int] | None = None) -> Job:
        """Queues one input's windows (encoder inputs), decoded side by side; `on_done(job)` runs, on the
        stepping thread, when its last window ends. Thread-safe: the server submits from its event loop
        while a thread steps. `temperature` > 0 samples (seeded by `seed`), else greedy; `decoding`, when
        given, replaces those three (and adds the fallback rules)."""
        decoding = decoding or Decoding(max_new_tokens, (temperature,), seed, timestamps)
        job = self._job(decoding, on_done, len(windows))
        job.on_window = on_window
        frames = frames or [0] * len(windows)
        with self._lock:
            self._queue.extend(self._window(job, index, features, list(prompt), frames[index], index * self.window_seconds)
                               for index, features in enumerate(windows))
        return job

    def _job(self, decoding: Decoding, on_done: Callable[[Job], None] | None, windows: int) -> Job:
        decoding.check()
        sampled = any(t > 0 for t in decoding.temperatures)
        return Job(decoding, on_done, [[] for _ in range(windows)], max(windows, 1), decoding.max_new_tokens,
                   generator=np.random.default_rng(decoding.seed) if sampled else None)

    window_seconds = 0.0  # the span of a fixed window (Whisper: 30 s), for its offset

    def _window(self, job: Job, index: int, features: np.ndarray, prompt: list[int], frames: int = 0, offset: float = 0.0) -> Window:
        sot = len(prompt) - 1 - prompt[::-1].index(self.decoder_start)
        measure = DETECT in prompt or job.decoding.no_speech_threshold is not None
        return Window(job, index, features, prompt, list(prompt), sot=sot, stop=sot + 1 if measure else None,
                      frames=frames, offset=offset, cross_len=self.cross_len(features))

    def cross_len(self, features: np.ndarray) -> int:
        """Encoder positions a window's input gives (Whisper: always 1500)."""
        raise NotImplementedError

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
        """Admits, encodes, grows (preempting when short), runs one decoder call for every active window
        and ends those that finished; returns how many ended (the module docstring has the order)."""
        ended = 0
        with self._lock:  # admission in order while the pool has room (the text scheduler's first-come rule)
            while self._queue and len(self._active) < self.max_windows:
                window = self._queue[0]
                if window.job.cancelled:
                    self._queue.popleft()
                    window.job.error = window.job.error or CANCELLED
                    self._finish(window.job)
                    continue
                window.held = window.held or Held(audio_key(window.features), cross_count=-(-window.cross_len // self.blocks.block_size))
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
                                        cross_len=window.cross_len))
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
        budget = self.manifest.decoder.max_model_len - len(window.prompt)
        budget = min(job.max_new_tokens or budget, budget)
        scores = self._scores(window, logits, output, budget)
        temperature = job.decoding.temperatures[window.attempt]
        if temperature >= GREEDY_BELOW:  # below it, dividing by the temperature overflows: greedy, as the text engine
            token = int(job.generator.choice(len(scores), p=_softmax(scores / temperature)))
        else:
            token = int(np.argmax(scores))
        if job.decoding.logprob_threshold is not None:  # only the fallback rules read it
            window.logprob_sum += float(np.log(_softmax(scores)[token]))
        if token not in self.eos and len(output) < budget:
            window.tokens.append(token)
            output.append(token)
        if token in self.eos or len(output) >= budget:
            return self._end(key, ended_by_eos=token in self.eos)
        return 0

    def _scores(self, window: Window, logits: np.ndarray, output: list[int], budget: int) -> np.ndarray:
        """The logits row as generate's processors leave it: suppressed tokens, and Whisper's timestamp
        rules when the job has timestamps. `output`: the window's tokens so far; `budget`: how many it may have."""
        scores = logits.astype(np.float32, copy=True)
        if self.suppress.size:
            scores[self.suppress] = -np.inf
        if not output and self.begin_suppress.size:
            scores[self.begin_suppress] = -np.inf
        if window.job.timestamps:
            scores = self.rules.apply(scores, output)
        return scores

    @staticmethod
    def _known(window: Window) -> int:
        """How many of the window's tokens go into the next call: up to a position whose logits are
        needed first (language detection, the no-speech probability), else all."""
        return window.stop if window.stop is not None and window.done < window.stop else len(window.tokens)

    def _end(self, key: int, error: BaseException | None = None, ended_by_eos: bool = False) -> int:
        """Ends an active window: retried at the next temperature if the fallback rules ask (0 returned,
        the window keeps its blocks: encoder output and prompt K/V), else kept (`_kept` may queue the
        job's next window)."""
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
        if error is None and not skip:
            self._before_free(window, output, ended_by_eos)
        del self._active[key]
        self.blocks.free(window.held)
        if error is None:
            self.outcomes["skipped" if skip else "kept"] += 1
        job.error = job.error or error
        job.results[window.index] = [] if skip else output
        job.closed.add(window.index)
        if job.error is None and self._kept(window, output, skip):
            return 1  # its job goes on with another window
        if job.on_window is not None and job.error is None:
            job.on_window(job)
        self._finish(job)
        return 1

    def _before_free(self, window: Window, output: list[int], ended_by_eos: bool) -> None:
        """A kept window whose blocks are about to be freed (Whisper's word timing reads its cross K/V)."""

    def _kept(self, window: Window, output: list[int], skip: bool) -> bool:
        """After a window is kept (or skipped): True when its job queued a next window (Whisper's long form)."""
        return False

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

    def _encode(self, windows: list[Window]) -> None:
        """Encoder calls for the newly admitted windows whose input the pool does not hold; their cross
        K/V into their cross blocks."""
        size = self.blocks.block_size
        for first in range(0, len(windows), ENCODER_BATCH):
            batch = windows[first : first + ENCODER_BATCH]
            feeds = self._encoder_feeds(batch)
            slots = []
            for window in batch:
                positions = np.arange(window.cross_len)
                table = np.array([b.block_id for b in window.held.cross])
                slots.append(table[positions // size] * size + positions % size)
            if self.device_pool:  # the graph writes each window's cross K/V into its blocks, on the device
                binding = self.encoder.io_binding()
                for name, value in feeds.items():
                    binding.bind_cpu_input(name, value)
                binding.bind_cpu_input("slot_mapping", np.concatenate(slots))
                self.graph.pool.bind(binding)
                self.encoder.run_with_iobinding(binding)
            else:
                cross = self.encoder.run(None, feeds)
                for row, window in enumerate(batch):
                    self.graph.pool.write(slots[row], [layer[row, : window.cross_len] for layer in cross])
            for window in batch:
                self.blocks.encoded(window.held)
        self.encoded_windows += len(windows)

    def _encoder_feeds(self, batch: list[Window]) -> dict[str, np.ndarray]:
        """The encoder's inputs for a batch of windows."""
        raise NotImplementedError

def _softmax(row: np.ndarray) -> np.ndarray:
    shifted = np.exp(row.astype(np.float64) - np.max(row))
    return shifted / shifted.sum()


__all__ = ["CANCELLED", "DETECT", "CrossDecoderLoop", "Job", "Window"]
