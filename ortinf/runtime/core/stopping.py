"""The one place that decides that a request has finished by its output, and where that output ends.

A step gives a request one sampled token, or several (speculative decoding accepts proposals plus
one). `judge` walks them in order and stops at the first token that ends the request, so the tokens
after it are never appended: token ids, logprobs and `usage` are cut together, once, here.

A one-step request (RequestOptions.top_candidates: a beam search's step) ends after its one step,
whatever it sampled: the search (ortinf/tasks/beams.py) reads its candidates and decides.

Per token, in this order:
1. EOS (unless ignore_eos) or a stop token id, once min_tokens are out (EOS is not text; a stop
   token id is, as in vLLM, unless it is a special token that the detokenizer skips);
2. a stop string completed in the text (the detokenizer is fed here, token by token, so the token
   that completes the string is known);
3. max_tokens, then the context length ("length").
After the step's last token: the requested format is complete (the grammar accepts nothing more).

Ending a request for any other cause is not an output rule and lives elsewhere: a format that cannot
continue or an engine failure ends it with an error (engine.py), a client that leaves aborts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ortinf.runtime.core.detokenizer import IncrementalDetokenizer
from ortinf.runtime.core.request import FinishReason, Request


@dataclass(frozen=True, slots=True)
class Verdict:
    """How many of the step's tokens the request keeps, and whether (and why) it has finished."""

    keep: int
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None


def judge(request: Request, tokens: Sequence[int], detokenizer: IncrementalDetokenizer | None, max_model_len: int,
          format_complete: bool = False) -> Verdict:
    """The verdict on one step's sampled `tokens` for `request` (not yet appended to it). Feeds the
    kept tokens' text to `detokenizer` (None: a package without a tokenizer has no stop strings)."""
    params = request.sampling_params
    if request.options.top_candidates:
        return Verdict(len(tokens), FinishReason.LENGTH)
    before = request.num_output_tokens
    if params.max_tokens is not None and before >= params.max_tokens:  # max_tokens 0: the prompt's logprobs only (echo)
        return Verdict(0, FinishReason.LENGTH)
    for kept, token in enumerate(tokens, start=1):
        count = before + kept
        stop_token = None
        if count >= params.min_tokens:
            if not params.ignore_eos and token in request.eos_token_ids:
                return Verdict(kept, FinishReason.STOP)
            if token in params.stop_token_ids:
                stop_token = token
        if detokenizer is not None:
            stop = detokenizer.add_tokens((token,))
            if stop is not None:
                return Verdict(kept, FinishReason.STOP, stop)
        if stop_token is not None:
            return Verdict(kept, FinishReason.STOP, stop_token)
        if params.max_tokens is not None and count >= params.max_tokens:
            return Verdict(kept, FinishReason.LENGTH)
        if request.num_prompt_tokens + count >= max_model_len:
            return Verdict(kept, FinishReason.LENGTH)
    if format_complete:
        return Verdict(len(tokens), FinishReason.STOP)
    return Verdict(len(tokens))
