"""`fit` (ortinf/runtime/engine/input_processor.py): the one max_tokens rule and the one "does the prompt fit" check
of every prepared request, by value: a text prompt, an encoder-decoder's decoder start (one token), and a prompt
fitted again with its images' tokens."""

from __future__ import annotations

import pytest

from ortinf.errors import ContextLengthError, RequestError
from ortinf.runtime.engine.input_processor import fit
from ortinf.runtime.sample.sampling_params import SamplingParams


def test_no_max_tokens_is_what_the_context_leaves():
    assert fit(SamplingParams(max_tokens=None), 10, 64).max_tokens == 54
    assert fit(SamplingParams(max_tokens=None), 1, 64).max_tokens == 63  # an encoder-decoder's decoder start


def test_a_given_max_tokens_must_fit():
    assert fit(SamplingParams(max_tokens=54), 10, 64).max_tokens == 54
    with pytest.raises(ContextLengthError, match=r"prompt \(10 tokens\) \+ max_tokens \(55\)"):
        fit(SamplingParams(max_tokens=55), 10, 64)


def test_a_prompt_that_leaves_no_room_is_refused_in_its_words():
    with pytest.raises(ContextLengthError, match="the prompt has 64 tokens; the context length is 64"):
        fit(SamplingParams(max_tokens=None), 64, 64)
    with pytest.raises(ContextLengthError, match="the prompt has 70 tokens with its images; the context length is 64"):
        fit(SamplingParams(max_tokens=4), 70, 64, images=True)


def test_with_images_max_tokens_is_cut_to_what_is_left():
    """The client cannot count the tokens its images become: its max_tokens is cut, not refused."""
    assert fit(SamplingParams(max_tokens=50), 40, 64, images=True).max_tokens == 24
    assert fit(SamplingParams(max_tokens=8), 40, 64, images=True).max_tokens == 8


def test_an_empty_prompt_is_refused():
    with pytest.raises(RequestError, match="the prompt is empty"):
        fit(SamplingParams(max_tokens=None), 0, 64)
