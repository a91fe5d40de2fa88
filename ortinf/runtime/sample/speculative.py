"""Speculative decoding: n-gram prompt lookup (vLLM's "ngram" method) or a draft model
(ortinf/runtime/engine/draft_proposer.py), verified the same way.

N-gram lookup: each step, a decoding request whose last `n` tokens (prompt_lookup_max down to prompt_lookup_min)
occurred earlier in its prompt or output proposes the tokens that followed that occurrence (up to
num_speculative_tokens). The proposals ride in the same paged graph call as the request's last
token (a query of 1 + k tokens, K/V written for all of them), and the logits of every position
verify them: greedily, a proposal is kept while it equals the argmax, so the output is the tokens
greedy decoding would have produced; with sampling, proposal d at a position whose distribution is
p is kept with probability p(d) (the draft is a point mass), and on rejection a token is drawn from
p without d, renormalised: the standard rule, so the output distribution is unchanged. The first
rejected position's token (or, when all are kept, a bonus token from the last position) is the
step's last new token; the rejected positions' K/V slots are left behind the request's computed
length and its blocks past its tokens go back to the pool.

Requests whose next-token distribution depends on the tokens accepted in the same step are not
speculated on: repetition/presence/frequency penalties, structured output, bad_words, and
min_tokens not yet reached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ortinf.config import SpeculativeConfig
from ortinf.runtime.sample.request_options import RequestOptions
from ortinf.runtime.sample.sampling_params import SamplingParams


@dataclass(slots=True)
class SpecStats:
    """vLLM's spec_decode counters."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        while len(self.accepted_per_position) < num_drafted:
            self.accepted_per_position.append(0)
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


def can_speculate(params: SamplingParams, options: RequestOptions, num_output_tokens: int) -> bool:
    """Whether a request's next distributions do not depend on what is accepted within the step."""
    return not (params.has_penalties or params.structured_output is not None or options.bad_words_ids
                or num_output_tokens < params.min_tokens or options.top_candidates or options.whisper_timestamps is not None)


def propose_ngram(token_ids: list[int], config: SpeculativeConfig, limit: int) -> list[int]:
    """Up to `limit` tokens that followed an earlier occurrence of the longest matching suffix: the
    latest occurrence followed by a full `limit` tokens, else the earliest (the longest continuation;
    in a loop such as "a b a b a b" the latest occurrence is followed by one token only)."""
    limit = min(limit, config.num_speculative_tokens)
    if limit <= 0 or len(token_ids) < 2:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    # One pass over the history: the earlier places holding the last token, then how far back each
    # match reaches (in the rare candidates only), instead of one scan per n-gram length.
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])
    longest = min(config.prompt_lookup_max, len(tokens) - 1)
    length = np.ones(len(ends), dtype=np.int64)
    for back in range(1, longest):
        grows = (length == back) & (ends >= back)
        grows[grows] = tokens[ends[grows] - back] == tokens[-1 - back]
        if not grows.any():
            break
        length[grows] += 1
    if not ends.size or length.max() < config.prompt_lookup_min:
        return []
    matched = ends[length == length.max()]  # the longest matching suffix; each match is followed from end + 1
    full = matched[matched + 1 + limit <= len(tokens)]
    follow = int(full[-1] if full.size else matched[0]) + 1
    return tokens[follow : follow + limit].tolist()


def verify(rows: np.ndarray, drafts: list[int], greedy: bool, sample: Callable[[int], int] | None = None) -> list[int]:
    """The tokens a request keeps: accepted drafts, then one token from the first rejected position (or a
    bonus one after them all). `rows` are the processed logits of positions 0..k. Greedy: a proposal is
    kept while it equals the argmax. Sampling: `sample(i)` draws position i's token exactly as the request
    would draw it without speculation (the same distribution, the same uniform: the model runner's
    per-position streams), and a proposal is kept while it equals that draw. For a point-mass proposal
    (n-gram lookup, a greedy draft) this keeps it with probability p(d), as rejection sampling does, and
    the output is the same tokens whether or not the step speculated (issue 30, finding 7: a full pool,
    which stops proposals, changed a seeded request's tokens)."""
    kept: list[int] = []
    targets = rows.argmax(axis=1).tolist() if greedy else None
    for position in range(len(drafts) + 1):
        token = targets[position] if targets is not None else sample(position)
        if position == len(drafts) or token != drafts[position]:
            return kept + [token]
        kept.append(token)
    return kept


def draw(weights: np.ndarray, uniform: float) -> int:
    """The index where `uniform` falls in the (unnormalised) distribution `weights`."""
    cdf = np.cumsum(weights)
    return int(min(np.searchsorted(cdf, uniform * cdf[-1], side="right"), len(weights) - 1))
