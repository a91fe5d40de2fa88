"""The attention the tests check every kernel against, written once: float64 numpy, grouped heads, any mask."""

from __future__ import annotations

import numpy as np


def attend(queries: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float, visible: np.ndarray | None = None,
           softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """softmax(q k^T * scale) v per head, in float64. queries [n, H, D]; keys, values [KVH, c, D] (H a multiple of KVH:
    query head h reads KV head h // (H / KVH)); `visible` [n, c] (None: every key); `softcap`: logits through
    softcap * tanh(x / softcap) (Gemma 2); `sinks` [H]: one more logit per head, with no value (gpt-oss). -> [n, H, D]."""
    n, heads, dim = queries.shape
    group = heads // keys.shape[0]
    out = np.zeros((n, heads, dim))
    for h in range(heads):
        scores = queries[:, h].astype(np.float64) @ keys[h // group].astype(np.float64).T * scale  # [n, c]
        if softcap:
            scores = softcap * np.tanh(scores / softcap)
        if visible is not None:
            scores = np.where(visible, scores, -np.inf)
        top = scores.max(1, keepdims=True)
        if sinks is not None:
            top = np.maximum(top, sinks[h])
        probs = np.exp(scores - top)
        total = probs.sum(1, keepdims=True) + (0.0 if sinks is None else np.exp(sinks[h] - top))
        out[:, h] = (probs / total) @ values[h // group].astype(np.float64)
    return out


def causal(queries: int, context: int, window: int = 0) -> np.ndarray:
    """[queries, context + queries]: the step's query i (position context + i) sees keys up to its own position,
    the last `window` of them with a sliding window."""
    qpos = context + np.arange(queries)[:, None]
    kpos = np.arange(context + queries)[None, :]
    visible = kpos <= qpos
    return visible & (qpos - kpos < window) if window else visible
