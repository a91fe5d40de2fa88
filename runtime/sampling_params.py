"""SamplingParams: how one request samples and when it stops. Validated once, at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ortinf.errors import RequestError

MAX_LOGPROBS = 20
SEED_RANGE = 2**64  # numpy's generators take seeds in [0, 2**64); any int maps into it (vLLM's rule)
GREEDY_BELOW = 1e-5  # a temperature below this is greedy: dividing logits by it overflows float32 (vLLM's rule)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling and stopping parameters (vLLM's names and meanings).

    temperature 0 (or below 1e-5) is greedy. top_k 0 or -1 disables top-k. Penalties follow vLLM/OpenAI: the
    repetition penalty applies to prompt and output tokens, presence and frequency penalties to
    output tokens only. `seed` makes the request's samples reproducible whatever else is batched.
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    n: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in self.stop_token_ids):
            raise RequestError("stop_token_ids must be integers", param="stop_token_ids")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        _finite("temperature", self.temperature, low=0.0)
        _finite("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}", param='top_p')
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise RequestError(f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k}", param='top_k')
        _finite("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise RequestError(f"min_p must be in [0, 1], got {self.min_p}", param='min_p')
        _finite("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise RequestError(f"repetition_penalty must be > 0, got {self.repetition_penalty}", param='repetition_penalty')
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _finite(name, value)
            if not -2.0 <= value <= 2.0:
                raise RequestError(f"{name} must be in [-2, 2], got {value}", param=name)
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 0):
            raise RequestError(f"max_tokens must be a non-negative integer, got {self.max_tokens}", param='max_tokens')
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise RequestError(f"min_tokens must be a non-negative integer, got {self.min_tokens}", param='min_tokens')
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise RequestError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})", param='min_tokens')
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS):
                raise RequestError(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value}", param=name)
        if not isinstance(self.n, int) or self.n < 1:
            raise RequestError(f"n must be a positive integer, got {self.n}", param='n')
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                raise RequestError(f"seed must be an integer, got {self.seed!r}", param='seed')
            object.__setattr__(self, "seed", self.seed % SEED_RANGE)
        if any(t < 0 for t in self.stop_token_ids):
            raise RequestError("stop_token_ids must be non-negative token ids", param="stop_token_ids")
        if any(not s for s in self.stop):
            raise RequestError("stop strings must not be empty", param='stop')

    def for_sample(self, index: int) -> SamplingParams:
        """The parameters of sample `index` of n: one sample each, seeded seed + index when seeded."""
        return replace(self, n=1, seed=None if self.seed is None else (self.seed + index) % SEED_RANGE)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _finite(name: str, value: float, low: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, got {value!r}", param=name)
    if low is not None and value < low:
        raise RequestError(f"{name} must be >= {low}, got {value}", param=name)
