"""What the scheduler hands to the model runner, and what the runner hands back.

The model runner sees only these, never Request objects, so it can be driven by hand-built inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ortinf.runtime.sample.request_options import DEFAULT, RequestOptions
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request's share of a step.

    `token_ids` are the tokens computed now, starting at position `num_computed_tokens`. When
    `sample` is set the chunk reaches the end of the request's tokens and one token is sampled.
    `all_token_ids` is the request's whole history (read-only, for penalties and prompt logprobs).
    """

    request_id: str
    token_ids: Sequence[int]
    num_computed_tokens: int
    block_ids: Sequence[int]
    sample: bool
    sampling_params: SamplingParams
    all_token_ids: Sequence[int]
    num_prompt_tokens: int
    num_output_tokens: int
    spec_token_ids: tuple[int, ...] = ()  # proposed tokens at the end of token_ids, verified by this step's logits
    lora_slot: int = -1  # the request's LoRA adapter slot, -1 for the base model
    cross_block_ids: Sequence[int] = ()  # an encoder-decoder's cross blocks, holding `cross_len` encoder positions
    cross_len: int = 0
    encoder_input: EncoderInput | None = None  # set the step its cross blocks must be written (the encoder runs first)
    images: tuple[PlacedImage, ...] = ()  # a vision-language request's images (the runner feeds those this chunk covers)
    options: RequestOptions = DEFAULT  # the front-end's (candidates, watched tokens, Whisper's rules, bad words)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs are computed while the prompt is (re)computed the first time."""
        return self.sampling_params.prompt_logprobs is not None and self.num_output_tokens == 0


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """The requests of one step, in the order their rows come back."""

    scheduled: tuple[ScheduledRequest, ...]
    num_scheduled_tokens: int
    finished_request_ids: frozenset[str] = frozenset()
    preempted_request_ids: tuple[str, ...] = ()
    # the scheduler's encoder cache (ortinf/runtime/core/encoder_cache.py) decides the image embeddings the runner holds:
    # it drops `free_image_digests` first, then encodes `encode_images` (images this step's chunks cover, not held)
    encode_images: tuple[PlacedImage, ...] = ()
    free_image_digests: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Logprob of a chosen token, and the top-k alternatives (ids and logprobs, best first)."""

    token_id: int
    logprob: float
    rank: int
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelRunnerOutput:
    """Per request id: the sampled tokens (one, or with speculation the accepted proposals and one
    more) and their logprobs; prompt logprobs for prompt chunks, as
    (position of the first prompt token they score, entries): a chunk computed twice (preemption)
    lands on the same positions again, never after them."""

    sampled_token_ids: dict[str, list[int]] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    prompt_logprobs: dict[str, tuple[int, list[TokenLogprobs]]] = field(default_factory=dict)
    format_complete: set[str] = field(default_factory=set)  # the sampled token completed the request's grammar
    cannot_continue: dict[str, str] = field(default_factory=dict)  # no token may follow (grammar, allowed ids, bans): why
    # one-step requests' best next (token, log-probability) pairs, best first (RequestOptions.top_candidates)
    candidates: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    # the model's log-probabilities of the watched tokens, before any rule (RequestOptions.watch_token_ids)
    watched: dict[str, dict[int, float]] = field(default_factory=dict)


def top_logprobs(logprobs_row: np.ndarray, token_id: int, k: int) -> TokenLogprobs:
    """The logprob and rank of `token_id` in a row of logprobs, plus the row's top `k`."""
    chosen = float(logprobs_row[token_id])
    rank = int((logprobs_row > chosen).sum()) + 1
    if k <= 0:
        return TokenLogprobs(token_id, chosen, rank)
    top = np.argpartition(-logprobs_row, k - 1)[:k]
    top = top[np.argsort(-logprobs_row[top], kind="stable")]
    return TokenLogprobs(token_id, chosen, rank, tuple(int(i) for i in top), tuple(float(logprobs_row[i]) for i in top))
