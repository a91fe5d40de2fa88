"""Whisper's timestamp tokens: the rules that keep them well-formed while decoding, and segments from them.

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
