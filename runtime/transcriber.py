"""Transcriber: a Whisper package's encoder and paged decoder, many audio windows decoded together
(the loop is runtime/cross_loop.py; this module is what is Whisper's: prompts, the log-mel windows,
long form window after window, timestamps and word timing).

Audio is decoded in 30-second windows, two ways:
- side by side (`submit`, `LLM.transcribe`, models without timestamp tokens): fixed windows, all in
  the batch at once;
- window after window (`submit_long`, runtime/longform.py): each window starts where the last one's
  timestamps end and may be prompted with the text so far, as transformers' long-form generate.
Requests submit and a loop calls `step`: runtime/async_transcriber.py drives it for the server, so
concurrent requests' windows decode together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ortinf.errors import ConfigError, RequestError
from ortinf.manifest import SPEECH_RECOGNITION, Manifest
from ortinf.runtime.audio_features import HOP_LENGTH, SAMPLE_RATE, log_mel
from ortinf.runtime.cross_loop import DETECT, CrossDecoderLoop, Job, Window
from ortinf.runtime.longform import Decoding, Segment, history, split_segments, window_features
from ortinf.runtime.whisper_timestamps import TimestampRules
from ortinf.runtime.word_timing import token_times, words
from ortinf.providers.session import create_session


class Transcriber(CrossDecoderLoop):
    """Speech recognition with a Whisper package: on the CPU and OpenVINO (host pools), and on device
    providers (WebGPU, CUDA), whose pools the encoder graph writes in place."""

    def __init__(self, package_dir: str | Path, max_windows: int = 8, block_size: int = 16, intra_op_threads: int = 0,
                 provider: str = "cpu", num_blocks: int | None = None, enable_prefix_caching: bool = True) -> None:
        manifest = Manifest.load(package_dir)
        if manifest.task != SPEECH_RECOGNITION or manifest.speech is None or manifest.decoder is None:
            raise ConfigError(f"{package_dir} holds a {manifest.task} model, not speech recognition")
        self.speech = manifest.speech
        self._setup(package_dir, manifest, self.speech.source_positions, self.speech.encoder_graph, self.speech.encoder_write_graph,
                    self.speech.decoder_start_token_id, max_windows, block_size, provider, intra_op_threads, num_blocks,
                    enable_prefix_caching)
        self.alignment = None
        self.window_seconds = self.speech.window_samples / SAMPLE_RATE
        self.mel_filters = np.load(self.package / self.speech.mel_filters)
        self.language_ids = np.array(sorted(self.generation.get("lang_to_id", {}).values()), dtype=np.int64)
        no_timestamps = self.generation.get("no_timestamps_token_id")
        self.rules = (TimestampRules(no_timestamps, self.manifest.eos_token_ids[0], self.generation.get("max_initial_timestamp_index"))
                      if no_timestamps is not None and self.manifest.eos_token_ids else None)
        self.no_speech = no_timestamps - 1 if no_timestamps is not None else None  # <|nospeech|>, before <|notimestamps|>
        self.prompt = self._prompt()

    def cross_len(self, features: np.ndarray) -> int:
        return self.speech.source_positions

    def _encoder_feeds(self, batch: list[Window]) -> dict[str, np.ndarray]:
        return {"input_features": np.ascontiguousarray(np.stack([w.features for w in batch]))}

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

    def _before_free(self, window: Window, output: list[int], ended_by_eos: bool) -> None:
        if window.job.decoding.word_timestamps:  # its cross K/V are still in its blocks
            window.job.timings[window.index] = (output, self._token_times(window, ended_by_eos))

    def _kept(self, window: Window, output: list[int], skip: bool) -> bool:
        """Long form: the window's segments, the job's seek, and its next window queued."""
        job = window.job
        if job.features is None:
            return False
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
        if job.seek >= job.features.shape[1]:
            job.on_window = None  # told already: the loop finishes the job
            return False
        with self._lock:
            self._queue.appendleft(self._next_window(job))
        return True


__all__ = ["DETECT", "SAMPLE_RATE", "Decoding", "Transcriber"]
