"""SamplingParams: how one request samples and when it stops, as the client asked; validated once, at
construction. What the engine's front-ends ask beside it (output kind, beam candidates, Whisper's rules)
is RequestOptions (ortinf/runtime/sample/request_options.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ortinf.errors import RequestError
from ortinf.runtime.sample.structured_output import StructuredOutput

MAX_LOGPROBS = 20
MAX_BEAMS = 32
EARLY_STOPPING = (True, False, "never")  # transformers' values
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
    structured_output: StructuredOutput | None = None  # a grammar every output token must follow
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    allowed_token_ids: tuple[int, ...] | None = None  # only these may be sampled
    truncate_prompt_tokens: int | None = None  # keep only the last k prompt tokens (vLLM's rule)
    bad_words: tuple[str, ...] = ()  # words that may not be generated (vLLM's rule: their last token is banned where it would complete one)
    # Beam search (ortinf/runtime/sample/beam_search.py, transformers' rules): num_beams > 1 searches that many
    # beams and returns the n best hypotheses; length_penalty divides a hypothesis' log-probability by its
    # length to that power; early_stopping True ends once num_beams hypotheses are done, "never" only when
    # no better one can come, False (transformers' default) by transformers' heuristic.
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False

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
        if self.truncate_prompt_tokens is not None and (not isinstance(self.truncate_prompt_tokens, int) or self.truncate_prompt_tokens < 1):
            raise RequestError(f"truncate_prompt_tokens must be a positive integer, got {self.truncate_prompt_tokens}",
                               param="truncate_prompt_tokens")
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
        if self.structured_output is not None and not isinstance(self.structured_output, StructuredOutput):
            raise RequestError("structured_output must be a StructuredOutput", param="structured_output")
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", tuple(self.logit_bias.items()))
        bias = []
        for token, value in self.logit_bias:
            _token_id("logit_bias", token)
            _finite("logit_bias", value)
            if not -100.0 <= value <= 100.0:
                raise RequestError(f"logit_bias values must be in [-100, 100], got {value}", param="logit_bias")
            bias.append((int(token), float(value)))
        object.__setattr__(self, "logit_bias", tuple(bias))
        if self.allowed_token_ids is not None:
            if not self.allowed_token_ids:
                raise RequestError("allowed_token_ids must not be empty", param="allowed_token_ids")
            object.__setattr__(self, "allowed_token_ids", tuple(_token_id("allowed_token_ids", t) for t in self.allowed_token_ids))
        if isinstance(self.bad_words, str):
            object.__setattr__(self, "bad_words", (self.bad_words,))
        object.__setattr__(self, "bad_words", tuple(self.bad_words))
        if any(not isinstance(w, str) or not w for w in self.bad_words):
            raise RequestError("bad_words must be non-empty strings", param="bad_words")
        self._check_beams()

    def _check_beams(self) -> None:
        if isinstance(self.num_beams, bool) or not isinstance(self.num_beams, int) or not 1 <= self.num_beams <= MAX_BEAMS:
            raise RequestError(f"num_beams must be an integer in [1, {MAX_BEAMS}], got {self.num_beams!r}", param="num_beams")
        _finite("length_penalty", self.length_penalty)
        if not -10.0 <= self.length_penalty <= 10.0:  # length ** penalty must stay a finite, nonzero float
            raise RequestError(f"length_penalty must be in [-10, 10], got {self.length_penalty}", param="length_penalty")
        if self.early_stopping not in EARLY_STOPPING or not isinstance(self.early_stopping, (bool, str)):
            raise RequestError(f"early_stopping must be true, false or \"never\", got {self.early_stopping!r}", param="early_stopping")
        if self.num_beams == 1:
            return
        if self.max_tokens is not None and self.max_tokens < 1:
            raise RequestError("beam search needs max_tokens >= 1", param="max_tokens")
        if self.n > self.num_beams:
            raise RequestError(f"n ({self.n}) must not exceed the number of beams ({self.num_beams})", param="n")
        self.check_beam_fields()

    def check_beam_fields(self) -> None:
        """A RequestError for what a beam search cannot honour: refused, never silently dropped (vLLM's
        beam search takes none of these either)."""
        unsupported = [name for name, asked in (
            ("stop", bool(self.stop)), ("logprobs", self.logprobs is not None), ("prompt_logprobs", self.prompt_logprobs is not None),
            ("response_format / structured_outputs", self.structured_output is not None), ("logit_bias", bool(self.logit_bias)),
            ("repetition_penalty, presence_penalty and frequency_penalty", self.has_penalties)) if asked]
        if unsupported:
            raise RequestError(f"beam search does not take {unsupported[0]}: drop it, or sample without beams (stop token ids, "
                               "min_tokens, bad_words and allowed_token_ids work with beams)", param=unsupported[0].split()[0])

    def for_sample(self, index: int) -> SamplingParams:
        """The parameters of sample `index` of n: one sample each, seeded seed + index when seeded."""
        return replace(self, n=1, seed=None if self.seed is None else (self.seed + index) % SEED_RANGE)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def token_ids_to_check(self) -> tuple[int, ...]:
        """Every token id the request names, to be checked against the model's vocabulary."""
        return (*self.stop_token_ids, *(t for t, _ in self.logit_bias), *(self.allowed_token_ids or ()))

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _token_id(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise RequestError(f"{name} must hold non-negative token ids, got {value!r}", param=name)
    return int(value)


def _finite(name: str, value: float, low: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, got {value!r}", param=name)
    if low is not None and value < low:
        raise RequestError(f"{name} must be >= {low}, got {value}", param=name)
