"""Long-form Whisper, window to window: where the next 30-second window starts, what it is prompted
with, and whether a decoded window is kept, retried hotter, or skipped as silence.

The rules are openai-whisper's as transformers' WhisperForConditionalGeneration.generate has them
(generation_whisper.py: _retrieve_segment, _prepare_decoder_input_ids, _need_fallback), so that a
window-by-window decode here equals transformers' long-form `generate` token for token:
- a window's timestamp pairs are its segments; when it ends on a pair (not on a single timestamp), the
  audio after the last pair is decoded again in the next window, which starts there (`seek`);
- with `condition_on_previous_text`, the next window's prompt is <|startofprev|> and the last
  (max_target_positions / 2 - 1) tokens of every segment so far, while the window's temperature
  stayed below 0.5;
- a window whose tokens compress too well (repetition) or whose mean log-probability is too low is
  decoded again at the next temperature; one whose <|nospeech|> probability is high and whose mean
  log-probability is low is skipped.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from ortinf.errors import RequestError

FRAMES_PER_STAMP = 2  # a timestamp step (0.02 s) is two feature frames (hop 160 at 16 kHz: 0.01 s)
SECONDS_PER_FRAME = 0.01


@dataclass(slots=True)
class Segment:
    start: float  # seconds from the start of the audio
    end: float
    tokens: list[int]  # with their timestamp tokens, as the model wrote them
    window: int = 0  # the job's window it came from (its WindowStats)


@dataclass(slots=True)
class Decoding:
    """One request's decoding options (the names are openai-whisper's)."""

    max_new_tokens: int | None = None
    temperatures: tuple[float, ...] = (0.0,)  # the first, then the fallbacks in order
    seed: int | None = None
    timestamps: bool = False  # timestamp tokens; long audio then goes window after window, seeking
    condition_on_previous_text: bool = False
    compression_ratio_threshold: float | None = None  # openai-whisper's default is 2.4
    logprob_threshold: float | None = None  # -1.0
    no_speech_threshold: float | None = None  # 0.6
    word_timestamps: bool = False  # each kept token's time, from the alignment heads (ortinf/tasks/speech/word_timing.py)

    def check(self) -> None:
        if not self.temperatures or any(not (0.0 <= t <= 2.0) for t in self.temperatures):
            raise RequestError("temperature must be in [0, 2]", param="temperature")
        if self.no_speech_threshold is not None and self.logprob_threshold is None:
            raise RequestError("no_speech_threshold needs logprob_threshold: a window is skipped when both say so",
                               param="no_speech_threshold")
        if self.condition_on_previous_text and not self.timestamps:
            raise RequestError("condition_on_previous_text needs timestamps: windows then follow each other", param="prompt")


FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def openai_decoding(temperature: float, timed: bool, silence: bool, fallback: bool = True, seed: int | None = None) -> Decoding:
    """OpenAI's transcription semantics, as openai-whisper's `transcribe` defaults: temperature 0 is greedy
    that retries at 0.2, 0.4, ... 1.0 when a window's text repeats (compression ratio over 2.4) or is
    unlikely (mean log-probability under -1); a probably silent window is skipped (`silence`: the model
    has <|nospeech|>); `timed` windows follow each other, prompted with the text so far. Without
    `fallback`: the temperature alone, no judging."""
    if not fallback:
        return Decoding(temperatures=(temperature,), seed=seed, timestamps=timed, condition_on_previous_text=timed)
    return Decoding(temperatures=FALLBACK_TEMPERATURES if temperature == 0 else (temperature,), seed=seed, timestamps=timed,
                    condition_on_previous_text=timed, compression_ratio_threshold=2.4, logprob_threshold=-1.0,
                    no_speech_threshold=0.6 if silence else None)


def compression_ratio(tokens: list[int], vocab_size: int) -> float:
    """Raw token bytes over zlib-compressed bytes (transformers' _retrieve_compression_ratio)."""
    width = int(math.log2(vocab_size) / 8) + 1
    raw = b"".join(t.to_bytes(width, "little") for t in tokens)
    return len(raw) / len(zlib.compress(raw))


def judge(decoding: Decoding, tokens: list[int], logprob_sum: float, no_speech_prob: float | None,
          vocab_size: int) -> tuple[bool, bool]:
    """(needs_fallback, skip) of a decoded window: `tokens` as sampled (EOS included when it came),
    `logprob_sum` the sum of their log-probabilities under the processed logits."""
    fallback = skip = False
    if decoding.compression_ratio_threshold is not None and compression_ratio(tokens, vocab_size) > decoding.compression_ratio_threshold:
        fallback = True
    mean = logprob_sum / max(len(tokens), 1)
    if decoding.logprob_threshold is not None and mean < decoding.logprob_threshold:
        fallback = True
    if (decoding.no_speech_threshold is not None and mean < decoding.logprob_threshold
            and no_speech_prob is not None and no_speech_prob > decoding.no_speech_threshold):
        fallback, skip = False, True
    return fallback, skip


def split_segments(tokens: list[int], begin: int, seek_frames: int, offset: float) -> tuple[list[Segment], int]:
    """A window's segments, and how many frames the next window starts after this one's start.
    `tokens`: the window's sampled tokens without EOS; `begin`: the first timestamp token; `seek_frames`:
    the window's feature frames (3000, or fewer at the end of the audio); `offset`: its start in seconds."""
    stamp = [t >= begin for t in tokens]
    single_ending = stamp[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(tokens) - 1) if stamp[i] and stamp[i + 1]]
    if not cuts:  # no closed pair: the whole window is one segment, ending at its last timestamp or its end
        stamps = [t for t in tokens if t >= begin]
        end_step = stamps[-1] - begin if stamps and stamps[-1] != begin else int(seek_frames * SECONDS_PER_FRAME / 0.02)
        return [Segment(offset, offset + end_step * 0.02, list(tokens))], seek_frames
    if single_ending:
        cuts.append(len(tokens))
    else:
        cuts[-1] += 1  # the last pair's second timestamp stays in the last segment
    segments, last = [], 0
    for i, cut in enumerate(cuts):
        piece = tokens[last:cut]
        end = piece[-1 if i < len(cuts) - 1 or single_ending else -2]
        segments.append(Segment(offset + (piece[0] - begin) * 0.02, offset + (end - begin) * 0.02, piece))
        last = cut
    if single_ending:  # nothing is said after the last timestamp
        return segments, seek_frames
    return segments, (tokens[last - 2] - begin) * FRAMES_PER_STAMP  # decode again from the last pair's timestamp


def history(segments: list[Segment], begin: int, limit: int) -> list[int]:
    """The tokens of every segment so far, as the next window's conditioning (a segment ending in two
    timestamps gives only the first), the last `limit` of them."""
    joined = [t for s in segments for t in (s.tokens[:-1] if len(s.tokens) > 2 and s.tokens[-2] >= begin else s.tokens)]
    return joined[-limit:]


def window_features(features: np.ndarray, seek: int, window_frames: int) -> tuple[np.ndarray, int]:
    """The window of the whole audio's log-mel `features` [mels, frames] starting at frame `seek`,
    zero-padded to `window_frames`, and how many real frames it holds."""
    piece = features[:, seek : seek + window_frames]
    frames = piece.shape[1]
    if frames < window_frames:
        piece = np.pad(piece, ((0, 0), (0, window_frames - frames)))
    return np.ascontiguousarray(piece), frames


__all__ = ["FALLBACK_TEMPERATURES", "Decoding", "openai_decoding", "Segment", "compression_ratio", "history", "judge", "split_segments",
           "window_features"]
