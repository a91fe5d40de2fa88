"""Sampler: penalties -> temperature -> top-k / top-p / min-p -> sample, vectorised over the batch.

Randomness: a request with a seed draws exactly one uniform number per sampled token from its own
generator, so its samples do not depend on what else is in the batch; requests without a seed share
the runner's generator. Logprobs are those of the model's distribution (before penalties and
temperature), as OpenAI and vLLM report them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ortinf.runtime.sample.sampling_params import SamplingParams


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def apply_penalties(logits: np.ndarray, params: SamplingParams, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
    """vLLM's penalties, in place on one row: repetition over prompt + output, presence and
    frequency over output tokens only."""
    vocab = logits.shape[-1]
    output_counts = np.bincount(np.asarray(output_ids, dtype=np.int64), minlength=vocab)[:vocab]
    if params.repetition_penalty != 1.0:
        seen = output_counts > 0
        seen[np.asarray(prompt_ids, dtype=np.int64)] = True
        with np.errstate(divide="ignore", over="ignore"):  # a penalty near 0 or huge overflows to +-inf on purpose
            logits[seen] = np.where(logits[seen] > 0, logits[seen] / params.repetition_penalty, logits[seen] * params.repetition_penalty)
    if params.frequency_penalty:
        logits -= params.frequency_penalty * output_counts
    if params.presence_penalty:
        logits -= params.presence_penalty * (output_counts > 0)


def filter_sorted(sorted_logits: np.ndarray, top_k: np.ndarray, top_p: np.ndarray, min_p: np.ndarray) -> np.ndarray:
    """Masks (-inf) the tail of rows sorted in descending order by top-k, top-p and min-p.

    The first (most likely) token of a row is never masked.
    """
    rows, vocab = sorted_logits.shape
    position = np.arange(vocab)[None, :]
    k = np.where(top_k > 0, top_k, vocab)[:, None]
    probs = np.exp(sorted_logits - sorted_logits[:, :1])
    probs /= probs.sum(axis=1, keepdims=True)
    before = np.cumsum(probs, axis=1) - probs  # mass of the tokens ranked above each one
    drop = (position >= k) | (before > top_p[:, None]) | (probs < min_p[:, None] * probs[:, :1])
    drop[:, 0] = False
    return np.where(drop, -np.inf, sorted_logits)


class Sampler:
    """Samples one token per row of logits."""

    def __call__(
        self,
        logits: np.ndarray,
        params: Sequence[SamplingParams],
        histories: Sequence[tuple[Sequence[int], Sequence[int]]],
        generators: Sequence[np.random.Generator],
        banned: Sequence[Sequence[int]] = (),
        allowed: Sequence[np.ndarray | None] = (),
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Returns (token ids [rows], model logprobs [rows, vocab] or None when nobody asked).

        histories[i] is (prompt token ids, output token ids) of row i; generators[i] its RNG;
        banned[i] the token ids row i may not produce now (EOS and stop ids before min_tokens, bad
        words); allowed[i] a bool mask of the only tokens row i may produce, or None (grammar,
        allowed_token_ids). logit_bias is added after the penalties.
        """
        wants_logprobs = any(p.logprobs is not None for p in params)
        logprobs = log_softmax(np.asarray(logits, dtype=np.float32)) if wants_logprobs else None
        logits = self.process(logits, params, histories, banned, allowed)
        tokens = logits.argmax(axis=1)
        sampled = np.array([not p.greedy for p in params])
        if sampled.any():
            rows = np.flatnonzero(sampled)
            temperature = np.array([params[r].temperature for r in rows], dtype=np.float32)
            scaled = logits[rows] / temperature[:, None]
            if any(params[r].has_penalties for r in rows):  # only penalties overflow (temperature >= 1e-5)
                infinite = np.isposinf(scaled).any(axis=1)
                if infinite.any():  # only the +inf tokens have mass (else inf - inf = NaN, and index 0 won)
                    scaled[infinite] = np.where(np.isposinf(scaled[infinite]), 0.0, -np.inf)
            uniforms = np.array([generators[r].random() for r in rows])
            tokens[rows] = self._draw(scaled, [params[r] for r in rows], uniforms)
        return tokens, logprobs

    @staticmethod
    def process(logits: np.ndarray, params: Sequence[SamplingParams], histories: Sequence[tuple[Sequence[int], Sequence[int]]],
                banned: Sequence[Sequence[int]] = (), allowed: Sequence[np.ndarray | None] = ()) -> np.ndarray:
        """A float32 copy of the logits after penalties, logit_bias, allowed masks and bans."""
        model = np.asarray(logits, dtype=np.float32)
        logits = np.array(model)  # a copy: penalties and filters work in place
        for row, (p, (prompt_ids, output_ids)) in enumerate(zip(params, histories)):
            if p.has_penalties:
                apply_penalties(logits[row], p, prompt_ids, output_ids)
        vocab = logits.shape[1]
        for row, p in enumerate(params):
            if p.logit_bias:
                ids = np.array([t for t, _ in p.logit_bias])
                keep = ids < vocab
                np.add.at(logits[row], ids[keep], np.array([b for _, b in p.logit_bias], dtype=np.float32)[keep])
        masked = [row for row, mask in enumerate(allowed) if mask is not None]
        if masked:  # one vectorised write for all constrained rows
            rows = logits[masked]
            rows[~np.stack([allowed[row] for row in masked])] = -np.inf
            logits[masked] = rows
        for row, ids in enumerate(banned):
            ids = [i for i in ids if 0 <= i < vocab]  # a package's EOS id beyond its vocabulary bans nothing
            if ids:
                logits[row, ids] = -np.inf
        # only penalties and masks can leave a row with nothing: check those rows, not the whole batch
        suspects = [row for row, p in enumerate(params) if p.has_penalties or (row < len(allowed) and allowed[row] is not None)]
        dead = [row for row in suspects if np.isneginf(logits[row]).all()]
        for row in dead:  # penalties (a huge repetition_penalty) sent every allowed token to -inf: they cannot ban them all
            logits[row] = model[row]
            if row < len(allowed) and allowed[row] is not None:
                logits[row, ~allowed[row]] = -np.inf
            if row < len(banned):
                logits[row, [i for i in banned[row] if 0 <= i < vocab]] = -np.inf
        return logits

    @staticmethod
    def draw_row(processed: np.ndarray, params: SamplingParams, uniform: float) -> int:
        """One sampled row's token from its processed logits and its uniform draw, with exactly the
        arithmetic of __call__ (speculative verification draws each position this way)."""
        scaled = processed[None, :] / np.array([params.temperature], dtype=np.float32)[:, None]
        return int(Sampler._draw(scaled, [params], np.array([uniform]))[0])

    @staticmethod
    def distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
        """The probabilities one request samples from at each of its rows (temperature, top-k, top-p,
        min-p applied to processed logits), for verifying speculative tokens."""
        scaled = logits / np.float32(params.temperature)
        rows = len(scaled)
        if params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0:
            order = np.argsort(-scaled, axis=1, kind="stable")
            filtered = filter_sorted(np.take_along_axis(scaled, order, axis=1), np.full(rows, params.top_k),
                                     np.full(rows, params.top_p), np.full(rows, params.min_p))
            scaled = np.empty_like(filtered)
            np.put_along_axis(scaled, order, filtered, axis=1)
        probs = np.exp(scaled - scaled.max(axis=1, keepdims=True))
        return probs / probs.sum(axis=1, keepdims=True)

    @staticmethod
    def _draw(scaled: np.ndarray, params: Sequence[SamplingParams], uniforms: np.ndarray) -> np.ndarray:
        top_k = np.array([p.top_k for p in params])
        top_p = np.array([p.top_p for p in params])
        min_p = np.array([p.min_p for p in params])
        if (top_k > 0).any() or (top_p < 1.0).any() or (min_p > 0).any():
            order = np.argsort(-scaled, axis=1, kind="stable")
            candidates = filter_sorted(np.take_along_axis(scaled, order, axis=1), top_k, top_p, min_p)
        else:
            order, candidates = None, scaled
        probs = np.exp(candidates - candidates.max(axis=1, keepdims=True))
        cdf = np.cumsum(probs, axis=1)
        index = (cdf < uniforms[:, None] * cdf[:, -1:]).sum(axis=1)
        index = np.minimum(index, probs.shape[1] - 1)
        if order is None:
            return index
        return order[np.arange(len(index)), index]
