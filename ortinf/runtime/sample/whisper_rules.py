"""Whisper's decoding rules, as the engine applies them to the rows of the requests that ask for them
(RequestOptions.whisper_timestamps), and segments read back from timestamp tokens.

SpeechRules: the package's generation config (suppressed tokens always, begin-suppressed ones as the first
output token) and the timestamp rules, applied as transformers' generate applies its logits processors:
before the scores it reports, so a request's logprobs are of the processed row (the fallback's
average log-probability is transformers').

Timestamp tokens:

With timestamps on (no <|notimestamps|> in the prompt), Whisper writes `<|t0|> text <|t1|>` segments;
token `timestamp_begin + i` (timestamp_begin = no_timestamps_token_id + 1) means i * 0.02 s into the
window. The rules, per step (openai/whisper's, as transformers' WhisperTimeStampLogitsProcessor has them):
- <|notimestamps|> is never sampled;
- timestamps come in pairs: after one timestamp that follows text, only a timestamp or EOS-or-later
  tokens; after two, text only;
- timestamps never go back (nor repeat <|0.00|>);
- the first sampled token is a timestamp, at most `max_initial_timestamp_index` steps in;
- when the probability mass of all timestamps beats the likeliest text token, a timestamp it is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

PRECISION = 0.02  # seconds per timestamp step


class TimestampRules:
    def __init__(self, no_timestamps_token_id: int, eos_token_id: int, max_initial_timestamp_index: int | None = None) -> None:
        self.no_timestamps = no_timestamps_token_id
        self.begin = no_timestamps_token_id + 1
        self.eos = eos_token_id
        self.max_initial = max_initial_timestamp_index

    def apply(self, logits: np.ndarray, sampled: list[int]) -> np.ndarray:
        """The logits row with what may not come next at -inf; `sampled` is what this window has decoded."""
        out = logits.astype(np.float32, copy=True)
        out[self.no_timestamps] = -np.inf
        last = len(sampled) >= 1 and sampled[-1] >= self.begin
        penultimate = len(sampled) < 2 or sampled[-2] >= self.begin
        if last:
            if penultimate:
                out[self.begin :] = -np.inf
            else:
                out[: self.eos] = -np.inf
        stamps = [t for t in sampled if t >= self.begin]
        if stamps:
            floor = stamps[-1] if last and not penultimate else stamps[-1] + 1
            out[self.begin : floor] = -np.inf
        if not sampled:
            out[: self.begin] = -np.inf
            if self.max_initial is not None:
                out[self.begin + self.max_initial + 1 :] = -np.inf
        shifted = out.astype(np.float64) - np.max(out)
        logprobs = shifted - np.log(np.sum(np.exp(shifted)))
        stamp_mass = np.logaddexp.reduce(logprobs[self.begin :])
        if stamp_mass > np.max(logprobs[: self.begin]):
            out[: self.begin] = -np.inf
        return out

    def segments(self, tokens: list[int], offset: float = 0.0) -> list[tuple[float, float, list[int]]]:
        """(start, end, text tokens) of each closed `<|a|> text <|b|>` pair, in seconds from `offset`."""
        found, start, text = [], None, []
        for token in tokens:
            if token < self.begin:
                text.append(token)
                continue
            time = offset + (token - self.begin) * PRECISION
            if start is None:
                start = time
            else:
                found.append((start, time, text))
                start, text = None, []
        return found


class SpeechRules:
    """A Whisper package's rules, applied to a batch's rows by request data (never by functions)."""

    def __init__(self, suppress: Sequence[int], begin_suppress: Sequence[int], timestamps: TimestampRules | None) -> None:
        self.suppress = np.asarray(suppress, dtype=np.int64)
        self.begin_suppress = np.asarray(begin_suppress, dtype=np.int64)
        self.timestamps = timestamps

    @classmethod
    def load(cls, package_dir: str | Path, vocab_size: int, eos_token_ids: Sequence[int]) -> SpeechRules:
        """From the package's generation_config.json (ids past the vocabulary ignored; one-token bad words
        are suppressed, as DecoderRules has them)."""
        path = Path(package_dir) / "generation_config.json"
        config = json.loads(path.read_text()) if path.is_file() else {}
        banned = [w[0] for w in config.get("bad_words_ids") or [] if len(w) == 1]
        no_timestamps = config.get("no_timestamps_token_id")
        stamps = (TimestampRules(no_timestamps, eos_token_ids[0], config.get("max_initial_timestamp_index"))
                  if no_timestamps is not None and eos_token_ids else None)
        return cls([t for t in (config.get("suppress_tokens") or []) + banned if t < vocab_size],
                   [t for t in config.get("begin_suppress_tokens") or [] if t < vocab_size], stamps)

    def apply(self, logits: np.ndarray, rows: Sequence[tuple[int, Sequence[int], bool]]) -> np.ndarray:
        """A float32 copy of `logits` with each (row, its output so far, timestamps?) processed."""
        out = np.array(logits, dtype=np.float32)
        for row, output, timestamps in rows:
            if self.suppress.size:
                out[row, self.suppress] = -np.inf
            if not output and self.begin_suppress.size:
                out[row, self.begin_suppress] = -np.inf
            if timestamps and self.timestamps is not None:
                out[row] = self.timestamps.apply(out[row], list(output))
        return out


__all__ = ["PRECISION", "SpeechRules", "TimestampRules"]
