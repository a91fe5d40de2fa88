"""Word-level timing for Whisper: where in the audio each token was said, from the cross-attention of
the model's alignment heads, by dynamic time warping (openai-whisper's method, as transformers'
_extract_token_timestamps has it).

For one window: the alignment graph (ortinf/exporter/whisper.py, `alignment.onnx`) gives the alignment heads'
cross-attention weights [heads, tokens, 1500] for the prompt and the decoded tokens. The rows of the
decoded tokens, cut to the audio actually in the window, are normalised over the tokens, median
filtered along time, averaged over the heads; DTW over their negation pairs each token with encoder
frames (20 ms each), and a token's time is the frame where the path first reaches it. The last token
(EOS, or the last one decoded) repeats the time before it. Words are runs of tokens, a new one at each
token whose text starts with a space; a word spans from its first token's time to the next token's.
"""

from __future__ import annotations

import numpy as np

PRECISION = 0.02  # seconds per encoder frame


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over a window of `width` (odd) along the last axis, reflect-padded (transformers' _median_filter)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.sort(windows, axis=-1)[..., pad]


def dtw(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through `matrix` [tokens, frames]: (token index, frame index) per step.
    Costs in float32 and ties broken as transformers' _dynamic_time_warping (diagonal, then up, else
    left); computed an anti-diagonal at a time, since every cell needs only the two before it."""
    rows, cols = matrix.shape
    cost = np.full((rows + 1, cols + 1), np.inf, dtype=np.float32)
    trace = np.full((rows + 1, cols + 1), -1, dtype=np.int8)
    cost[0, 0] = 0
    values = matrix.astype(np.float32)
    for diagonal in range(2, rows + cols + 1):
        i = np.arange(max(1, diagonal - cols), min(rows, diagonal - 1) + 1)
        j = diagonal - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        step = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        cost[i, j] = values[i - 1, j - 1] + np.choose(step, [c0, c1, c2])
        trace[i, j] = step
    trace[0, :], trace[:, 0] = 2, 1
    i, j, text, time = rows, cols, [], []
    while i > 0 or j > 0:
        text.append(i - 1)
        time.append(j - 1)
        move = trace[i, j]
        if move == 0:
            i, j = i - 1, j - 1
        elif move == 1:
            i -= 1
        else:
            j -= 1
    return np.array(text[::-1]), np.array(time[::-1])


def token_times(weights: np.ndarray, prompt_len: int, frames: int, median_width: int) -> np.ndarray:
    """Seconds into the window of every token: `weights` [heads, rows, positions] for the prompt and the
    decoded tokens but the last; `frames` the window's real feature frames. Returns rows + 1 times,
    the prompt's zero."""
    rows = weights.shape[1]
    times = np.zeros(rows + 1, dtype=np.float64)
    matrix = weights[:, prompt_len:, : frames // 2].astype(np.float32)
    if matrix.shape[1] == 0:
        return times
    mean = matrix.mean(axis=1, keepdims=True)
    std = matrix.std(axis=1, keepdims=True)
    matrix = median_filter((matrix - mean) / std, median_width).mean(axis=0)
    text, time = dtw(-matrix.astype(np.float64))
    jumps = np.pad(np.diff(text), (1, 0), constant_values=1).astype(bool)
    jump_times = time[jumps] * PRECISION
    times[prompt_len:] = np.concatenate([jump_times, jump_times[-1:]])
    return times


def words(pieces: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """Tokens' (text, start, end) joined into words: a new word at each piece that starts with a space."""
    found: list[list] = []
    for text, start, end in pieces:
        if not text:
            continue
        if not found or text[:1].isspace():
            found.append([text, start, end])
        else:
            found[-1][0] += text
            found[-1][2] = end
    return [(text.strip(), start, end) for text, start, end in found if text.strip()]


__all__ = ["dtw", "median_filter", "token_times", "words"]
