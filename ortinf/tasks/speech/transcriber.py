"""Transcriber: speech recognition with a Whisper package, a front-end over the one engine
(ortinf/runtime/engine/llm_engine.py; ortinf/tasks/speech/windows.py says how a window becomes a request). This module is
what is Whisper's: prompts, the log-mel windows, the words' times, the texts; and `drive`, which runs
jobs on this transcriber's own LLMEngine through the one driver (ortinf/tasks/driver.py) for offline use
(LLM.transcribe, `ortinf transcribe`). The server runs the same jobs on its AsyncEngine
(ortinf/tasks/speech/async_transcriber.py), beside any other request.

Audio is decoded in 30-second windows, two ways:
- side by side (`submit`, `LLM.transcribe`, models without timestamp tokens): fixed windows, all in
  the batch at once;
- window after window (`submit_long`, ortinf/tasks/speech/longform.py): each window starts where the last one's
  timestamps end and may be prompted with the text so far, as transformers' long-form generate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ortinf.config import EngineConfig
from ortinf.errors import ConfigError, RequestError
from ortinf.manifest import SPEECH_RECOGNITION, Manifest
from ortinf.providers.session import create_session
from ortinf.runtime.engine.llm_engine import LLMEngine
from ortinf.tasks import driver
from ortinf.tasks.speech import languages
from ortinf.tasks.speech.audio_features import HOP_LENGTH, SAMPLE_RATE, log_mel
from ortinf.tasks.speech.longform import Decoding, Segment
from ortinf.tasks.speech.windows import DETECT, Job, Window, WindowDecoder, WindowJob
from ortinf.tasks.speech.word_timing import token_times, words


class Transcriber(WindowDecoder):
    """A Whisper package's engine and windows. Keyword options are EngineConfig's (max_num_seqs: windows
    decoded at once, num_blocks, kv_cache_memory, enable_prefix_caching, intra_op_threads, ...); an
    option the engine does not have is a ConfigError."""

    def __init__(self, package_dir: str | Path, provider: str = "auto", **options: Any) -> None:
        manifest = Manifest.load(package_dir)
        if manifest.task != SPEECH_RECOGNITION or manifest.speech is None or manifest.decoder is None:
            raise ConfigError(f"{package_dir} holds a {manifest.task} model, not speech recognition")
        try:
            config = EngineConfig(package_dir=Path(package_dir), provider=provider, **options)
        except TypeError as exc:
            raise ConfigError(f"unknown engine option: {exc}") from exc
        self.engine = LLMEngine(config)
        self.package, self.manifest, self.speech = Path(package_dir), manifest, manifest.speech
        self.tokenizer = self.engine.tokenizer
        if self.tokenizer is None and (self.package / "tokenizer.json").is_file():  # added after export (the manifest does not say)
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(self.package / "tokenizer.json"))
        path = self.package / "generation_config.json"
        self.generation = json.loads(path.read_text()) if path.is_file() else {}
        self.eos = set(manifest.eos_token_ids)
        self.vocab_size = manifest.decoder.vocab_size
        self.max_model_len = self.engine.max_model_len
        self.decoder_start = self.speech.decoder_start_token_id
        self.source_positions = self.speech.source_positions
        added = self.tokenizer.get_added_tokens_decoder() if self.tokenizer is not None else {}
        self.special = {i for i, token in added.items() if token.special} | self.eos
        self.window_seconds = self.speech.window_samples / SAMPLE_RATE
        self.mel_filters = np.load(self.package / self.speech.mel_filters)
        self.language_ids = np.array(sorted(self.generation.get("lang_to_id", {}).values()), dtype=np.int64)
        no_timestamps = self.generation.get("no_timestamps_token_id")
        self.rules = self.engine.runner.speech_rules.timestamps  # the engine applies them; segments are read with them here
        self.no_speech = no_timestamps - 1 if no_timestamps is not None else None  # <|nospeech|>, before <|notimestamps|>
        self.prompt = self._prompt()
        self.outcomes = {"kept": 0, "retried": 0, "skipped": 0}  # windows, for metrics
        self._alignment = self._host_encoder = None

    def stats(self) -> dict[str, float]:
        """Running totals and gauges for metrics: windows kept, retried hotter and skipped as silence, and
        the engine's preemptions, encoder outputs found in the pool, and pool use. Read from any thread."""
        engine = self.engine
        return {**self.outcomes, "preemptions": engine.scheduler.stats.num_preemptions,
                "encoder_cache_hits": engine.kv_cache.num_cross_hits, "kv_cache_usage": engine.kv_cache.usage()}

    def _prompt(self, language: str | None = None, task: str = "transcribe", text: str | None = None,
                timestamps: bool = False) -> list[int]:
        """The forced start: the decoder's start token, then language, task and no-timestamps where the
        generation config names them (multilingual checkpoints). With no language given, a multilingual
        model's language is detected per window (DETECT in its place: the window's probe finds it). `text`,
        a prompt (OpenAI's `prompt`: spellings, context), goes before them behind <|startofprev|>, its
        last half-context of tokens, as transformers' prompt_ids do."""
        prompt = [self.speech.decoder_start_token_id]
        if text:
            previous = self.generation.get("prev_sot_token_id")
            if previous is None or self.tokenizer is None:
                raise RequestError("this model takes no prompt (its generation config has no prev_sot_token_id)", param="prompt")
            ids = self.tokenizer.encode(" " + text.strip(), add_special_tokens=False).ids
            prompt = [previous, *ids[-(self.max_model_len // 2 - 1):], *prompt]
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

    def submit(self, windows: list[np.ndarray], prompt: list[int], max_new_tokens: int | None = None,
               temperature: float = 0.0, seed: int | None = None, timestamps: bool = False, decoding: Decoding | None = None,
               on_window: Callable[[Job], None] | None = None, frames: list[int] | None = None) -> Job:
        """One input's windows (encoder inputs), to be decoded side by side (`drive`, or WindowJob on an async
        engine). `temperature` > 0 samples (seeded by `seed`), else greedy; `decoding`, when given,
        replaces those three (and adds the fallback rules)."""
        decoding = decoding or Decoding(max_new_tokens, (temperature,), seed, timestamps)
        job = self._job(decoding, len(windows))
        job.on_window = on_window
        frames = frames or [0] * len(windows)
        queued = [self._window(job, index, features, list(prompt), frames[index], index * self.window_seconds)
                  for index, features in enumerate(windows)]
        job.fresh = queued
        return job

    def submit_long(self, samples: np.ndarray, prompt: list[int], decoding: Decoding, prompt_ids: list[int] | None = None,
                    on_window: Callable[[Job], None] | None = None) -> Job:
        """One audio decoded window after window, as transformers' long-form generate does
        (ortinf/tasks/speech/longform.py): each window starts where the last one's timestamps end, and with
        `decoding.condition_on_previous_text` is prompted with the text so far. `prompt` is the forced
        start (with timestamps: no <|notimestamps|>); `prompt_ids`, <|startofprev|> and the request's own
        prompt, goes before it until the text so far takes its place. The audio ends at its last real
        frame: no window, and no segment, reaches past it."""
        if self.rules is None:
            raise RequestError("this model has no timestamp tokens, so long audio is cut into fixed windows", param="response_format")
        if not decoding.timestamps:
            raise RequestError("window-after-window decoding needs timestamps", param="timestamp_granularities[]")
        samples = self._check(samples)
        size = self.speech.window_samples
        features = log_mel(samples, self.mel_filters, max(len(samples), size)) if len(samples) > size else log_mel(samples, self.mel_filters)
        job = self._job(decoding, 0)
        job.features, job.num_frames = features, min(features.shape[1], -(-len(samples) // HOP_LENGTH))
        job.init, job.prompt_ids = list(prompt), list(prompt_ids or [])
        job.condition, job.on_window = decoding.condition_on_previous_text, on_window
        if job.prompt_ids:  # the request's prompt is the first "segment" of the history (transformers' first-segment)
            job.segments.append(Segment(0.0, 0.0, job.prompt_ids[1:]))
        job.fresh = [self._next_window(job)]
        return job

    def drive(self, jobs: Sequence[Job], on_step: Callable[[], None] | None = None) -> None:
        """Decodes submitted jobs to their end on this transcriber's engine, together (ortinf/tasks/driver.py);
        a job that failed keeps its error in `job.error`."""
        driver.run(self.engine, [WindowJob(self, job) for job in jobs], on_step)

    def transcribe_ids(self, audios: Sequence[np.ndarray], max_new_tokens: int | None = None) -> list[list[int]]:
        """Greedy token ids of each audio (its windows' tokens joined, the forced prompt excluded)."""
        return [[t for window in windows for t in window] for windows in self._decode(audios, max_new_tokens, self.prompt)]

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
            jobs = [self.submit(self.windows(audio), forced, decoding=decoding, frames=self.window_frames(audio)) for audio in audios]
        total = sum(len(audio) for audio in audios) / SAMPLE_RATE
        bar = tqdm(total=round(total), desc="audio seconds", disable=not progress)
        try:
            self.drive(jobs, on_step=lambda: bar.update(round(min(total, sum(self.progress(job) for job in jobs))) - bar.n))
        finally:
            bar.close()
        for job in jobs:
            if job.error is not None:
                raise job.error
        return jobs

    def progress(self, job: Job) -> float:
        """Seconds of a job's audio decoded so far."""
        if job.features is not None:
            return job.seek * 0.01
        return len(job.closed) * self.window_seconds

    def _decode(self, audios: Sequence[np.ndarray], max_new_tokens: int | None, prompt: list[int]) -> list[list[list[int]]]:
        """Greedy token ids of each window of each audio: every window submitted, then steps until done."""
        jobs = [self.submit(self.windows(audio), prompt, max_new_tokens) for audio in audios]
        self.drive(jobs)
        for job in jobs:
            if job.error is not None:
                raise job.error
        return [job.results for job in jobs]

    def transcribe(self, audios: Sequence[np.ndarray], max_new_tokens: int | None = None) -> list[str]:
        """The text of each audio (16 kHz mono float samples): its windows' texts joined by a space."""
        return [" ".join(t for t in (self._text(ids) for ids in windows) if t)
                for windows in self._decode(audios, max_new_tokens, self.prompt)]

    # what a finished job says

    def segments(self, job: Job, duration: float) -> list[tuple[float, float, str]]:
        """(start, end, text) of a finished job: its timestamped segments, or its windows; none past `duration`."""
        if job.timestamps:
            found = self.timed_segments(job)
        else:
            size = self.window_seconds
            found = [(i * size, (i + 1) * size, self._text(ids)) for i, ids in enumerate(job.results)]
        return [(min(start, duration), min(end, duration), text) for start, end, text in found]

    def details(self, job: Job, duration: float) -> dict:
        """OpenAI's verbose_json extras of a finished job: the language (its name, None for an English-only
        model) and, for each of `segments(job, duration)`, the fields of its window's kept decoding."""
        if job.timestamps:
            pieces = self._timed_pieces(job)
        else:
            pieces = list(enumerate(job.results))
        fields = []
        for window, tokens in pieces:
            stats = job.stats.get(window)
            fields.append({
                "seek": stats.seek if stats else 0, "tokens": [int(t) for t in tokens],
                "temperature": stats.temperature if stats else 0.0, "avg_logprob": stats.avg_logprob if stats else 0.0,
                "compression_ratio": stats.compression_ratio if stats else 0.0, "no_speech_prob": stats.no_speech_prob if stats else 0.0,
            })
        language = None
        if job.language is not None and self.tokenizer is not None:
            language = languages.name(self.tokenizer.id_to_token(job.language) or "")
        elif not self.generation.get("is_multilingual"):
            language = "english"
        return {"language": language, "segments": fields}

    def _timed_pieces(self, job: Job) -> list[tuple[int, list[int]]]:
        """(window, tokens) of each timestamped segment, in timed_segments' order."""
        if job.features is not None:
            told = job.segments[1:] if job.prompt_ids else job.segments
            return [(s.window, s.tokens) for s in told]
        size = self.window_seconds
        return [(index, ids) for index, tokens in enumerate(job.results) for _, _, ids in self.rules.segments(tokens, offset=index * size)]

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

    def timed_segments(self, job: Job) -> list[tuple[float, float, str]]:
        """(start, end, text) of each timestamped segment of a finished timestamps job, over all its windows."""
        if job.features is not None:  # long form: the segments as the windows were cut (the request's prompt is not one)
            told = job.segments[1:] if job.prompt_ids else job.segments
            return [(s.start, s.end, self._text(s.tokens)) for s in told]
        size = self.window_seconds
        return [(start, end, self._text(ids)) for index, tokens in enumerate(job.results)
                for start, end, ids in self.rules.segments(tokens, offset=index * size)]

    def words(self, job: Job) -> list[tuple[str, float, float]]:
        """(word, start, end) of a finished word-timestamps job, in seconds into its audio."""
        found = []
        for index in sorted(job.timings):  # a word never spans two windows
            tokens, times = job.timings[index]
            found += words([(self.tokenizer.decode([token], skip_special_tokens=False), times[k], times[k + 1])
                            for k, token in enumerate(tokens)
                            if token < (self.rules.begin if self.rules else self.vocab_size) and token not in self.special])
        return found

    def _text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            raise ConfigError(f"{self.package} has no tokenizer: use transcribe_ids()")
        if self.rules is not None:
            ids = [t for t in ids if t < self.rules.begin]  # timestamp tokens are not text
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def _token_times(self, window: Window, tokens: list[int], ended_by_eos: bool) -> list[float]:
        """Seconds into the audio of each decoded token of a kept window, and of the end after the last
        one (ortinf/tasks/speech/word_timing.py): the alignment graph over its tokens and its cross K/V. Those are
        computed again here by the host encoder graph rather than read from the engine's pool, whose
        blocks the engine may reuse the moment the window's request ends (one encoder call per window
        asked for word timestamps)."""
        if self._alignment is None:
            if not self.speech.alignment_graph:
                raise RequestError("this package has no alignment graph for word timestamps: re-export it with this ortinf",
                                   param="timestamp_granularities[]")
            found, threads = self.engine.graph.found, self.engine.config.intra_op_threads
            self._alignment, _ = create_session(self.package / self.speech.alignment_graph, found, threads, spin=False)
            self._host_encoder, _ = create_session(self.package / self.speech.encoder_graph, found, threads, spin=False)
        prompt = len(window.prompt)
        output = len(tokens)
        rows = prompt + (output if ended_by_eos else max(output - 1, 0))  # the last token sampled was never fed
        all_tokens = window.prompt + tokens
        feeds = {"input_ids": np.array(all_tokens[:rows], dtype=np.int64)}
        wanted = {i.name for i in self._alignment.get_inputs()}
        cross = self._host_encoder.run(None, {"input_features": window.features[None]})  # per layer [1, positions, heads, dim]
        for index, layer in enumerate(cross):
            name = f"cross_{'key' if index % 2 == 0 else 'value'}.{index // 2}"
            if name in wanted:  # not past the last alignment layer (nor its V, which no weight needs)
                feeds[name] = np.ascontiguousarray(layer[0, : self.source_positions].swapaxes(0, 1))
        weights = self._alignment.run(None, feeds)[0]
        times = token_times(weights, prompt, window.frames, self.speech.median_filter_width)
        end = prompt + output + (1 if ended_by_eos else 0)
        padded = np.concatenate([times, np.repeat(times[-1:], max(end + 1 - len(times), 0))])
        return (window.offset + padded[prompt : prompt + output + 1]).tolist()


__all__ = ["DETECT", "SAMPLE_RATE", "Decoding", "Job", "Transcriber"]
