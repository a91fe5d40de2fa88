"""ortinf/runtime/core/stopping.py, the one place that decides a request has finished: each rule, their order, and
that a multi-token step (speculative decoding) keeps exactly the tokens up to the one that ended it."""

from __future__ import annotations

import pytest
from support.tiny_models import add_byte_tokenizer
from tokenizers import Tokenizer

from ortinf.runtime.core.detokenizer import IncrementalDetokenizer
from ortinf.runtime.core.request import FinishReason, Request
from ortinf.runtime.core.stopping import Verdict, judge
from ortinf.runtime.sample.sampling_params import SamplingParams

EOS = 2


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("bytes")
    add_byte_tokenizer(folder)
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def verdict(tokenizer, tokens, prompt=(5, 6), done=(), max_model_len=4096, format_complete=False, **params):
    """The verdict on `tokens` after a request has already produced `done`; also the text it kept."""
    sampling = SamplingParams(**params)
    request = Request("r", list(prompt), sampling, eos_token_ids=(EOS,))
    detok = IncrementalDetokenizer(tokenizer, prompt, sampling)
    for token in done:
        request.append_output_token(token)
        detok.add_tokens([token])
    return judge(request, tokens, detok, max_model_len, format_complete), detok.text


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_a_step_that_ends_nothing_keeps_all_its_tokens(tokenizer):
    tokens = ids(tokenizer, "hello")
    assert verdict(tokenizer, tokens, max_tokens=50) == (Verdict(len(tokens)), "hello")


def test_eos_ends_and_is_not_text_unless_ignored_or_before_min_tokens(tokenizer):
    tokens = [*ids(tokenizer, "ab"), EOS, *ids(tokenizer, "cd")]
    assert verdict(tokenizer, tokens, max_tokens=50) == (Verdict(3, FinishReason.STOP), "ab")
    assert verdict(tokenizer, tokens, max_tokens=50, ignore_eos=True)[0] == Verdict(5)
    assert verdict(tokenizer, tokens, max_tokens=50, min_tokens=4)[0] == Verdict(5)  # EOS was the 3rd: too early


def test_a_stop_token_id_ends_with_its_id_as_the_stop_reason(tokenizer):
    tokens = ids(tokenizer, "abcd")
    assert verdict(tokenizer, tokens, max_tokens=50, stop_token_ids=(tokens[1],))[0] == Verdict(2, FinishReason.STOP, tokens[1])


def test_a_stop_string_cuts_the_tokens_after_the_one_that_completed_it(tokenizer):
    tokens = ids(tokenizer, "say print(i) and more")
    result, text = verdict(tokenizer, tokens, max_tokens=50, stop=("print",))
    assert result == Verdict(len(ids(tokenizer, "say print")), FinishReason.STOP, "print") and text == "say "
    result, text = verdict(tokenizer, tokens, max_tokens=50, stop=("print",), include_stop_str_in_output=True)
    assert result.keep == len(ids(tokenizer, "say print")) and text == "say print"


def test_a_stop_string_split_across_steps(tokenizer):
    chars = [tokenizer.token_to_id(c) for c in "nt(x)"]  # one token per character
    result, text = verdict(tokenizer, chars, done=ids(tokenizer, "say pri"), max_tokens=50, stop=("print",))
    assert result == Verdict(2, FinishReason.STOP, "print") and text == "say "


def test_max_tokens_and_the_context_length_end_with_length(tokenizer):
    tokens = ids(tokenizer, "abcdef")
    assert verdict(tokenizer, tokens, done=ids(tokenizer, "xy"), max_tokens=5)[0] == Verdict(3, FinishReason.LENGTH)
    assert verdict(tokenizer, tokens, prompt=(5, 6, 7), max_model_len=7, max_tokens=None)[0] == Verdict(4, FinishReason.LENGTH)


def test_a_stop_string_wins_over_the_length_limit_on_the_same_token(tokenizer):
    assert verdict(tokenizer, ids(tokenizer, "abc"), max_tokens=3, stop=("bc",))[0] == Verdict(3, FinishReason.STOP, "bc")


def test_max_tokens_zero_keeps_nothing_and_finishes(tokenizer):
    assert verdict(tokenizer, ids(tokenizer, "a"), max_tokens=0)[0] == Verdict(0, FinishReason.LENGTH)


def test_a_complete_format_ends_after_the_steps_tokens(tokenizer):
    assert verdict(tokenizer, ids(tokenizer, "{}"), max_tokens=50, format_complete=True)[0] == Verdict(2, FinishReason.STOP)
    # an earlier rule still cuts first
    assert verdict(tokenizer, ids(tokenizer, "{}"), max_tokens=1, format_complete=True)[0] == Verdict(1, FinishReason.LENGTH)
