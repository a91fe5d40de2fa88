"""The sampler against straightforward numpy references on fixed logits."""

from __future__ import annotations

import numpy as np
import pytest

from ortinf.errors import RequestError
from ortinf.runtime.sample.sampler import Sampler, apply_penalties, log_softmax
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.worker.scheduler_output import top_logprobs

LOGITS = np.array([2.0, 1.5, 1.2, 0.3, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
DRAWS = 4000


def reference_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The distribution SamplingParams describes, written the slow and obvious way."""
    x = logits.astype(np.float64) / p.temperature
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    order = sorted(range(len(x)), key=lambda i: -x[i])
    keep = set()
    mass = 0.0
    for rank, i in enumerate(order):
        if p.top_k > 0 and rank >= p.top_k:
            break
        if rank > 0 and mass > p.top_p:
            break
        if rank > 0 and probs[i] < p.min_p * probs[order[0]]:
            break
        keep.add(i)
        mass += probs[i]
    out = np.array([probs[i] if i in keep else 0.0 for i in range(len(x))])
    return out / out.sum()


def empirical(p: SamplingParams) -> np.ndarray:
    sampler = Sampler()
    logits = np.tile(LOGITS, (DRAWS, 1))
    generators = [np.random.default_rng(seed) for seed in range(DRAWS)]
    tokens, _ = sampler(logits, [p] * DRAWS, [((), ())] * DRAWS, generators)
    return np.bincount(tokens, minlength=len(LOGITS)) / DRAWS


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.6),
        SamplingParams(temperature=1.0, min_p=0.3),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.8, min_p=0.05),
    ],
    ids=["t1", "t0.5", "top_k", "top_p", "min_p", "combined"],
)
def test_distribution_matches_reference(params):
    expected = reference_probs(LOGITS, params)
    got = empirical(params)
    assert np.all(got[expected == 0] == 0), "sampled a token outside the allowed set"
    assert np.abs(got - expected).max() < 0.03, (got, expected)


def test_greedy_is_argmax_and_ignores_generators():
    logits = np.random.default_rng(0).normal(size=(5, 50)).astype(np.float32)
    tokens, _ = Sampler()(logits, [SamplingParams(temperature=0)] * 5, [((), ())] * 5, [None] * 5)
    assert tokens.tolist() == logits.argmax(1).tolist()


def test_penalties_match_formula():
    logits = np.array([2.0, -1.0, 0.5, -0.2, 3.0], dtype=np.float32)
    prompt, output = [0, 1], [2, 2, 3]
    p = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    got = logits.copy()
    apply_penalties(got, p, prompt, output)
    expected = logits.copy()
    for token in set(prompt) | set(output):  # repetition: prompt and output
        expected[token] = expected[token] / 2.0 if expected[token] > 0 else expected[token] * 2.0
    for token in set(output):  # frequency and presence: output only
        expected[token] -= 0.25 * output.count(token) + 0.5
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_banned_ids_are_never_sampled():
    p = SamplingParams(temperature=1.0)
    logits = np.tile(LOGITS, (200, 1))
    tokens, _ = Sampler()(logits, [p] * 200, [((), ())] * 200, [np.random.default_rng(i) for i in range(200)], [(0, 1)] * 200)
    assert not set(tokens.tolist()) & {0, 1}
    greedy, _ = Sampler()(LOGITS[None], [SamplingParams(temperature=0)], [((), ())], [None], [(0,)])
    assert greedy.tolist() == [1]


def test_infinite_logits_share_the_mass():
    """A repetition penalty of 5e-324 divides positive logits of seen tokens to +inf: sampling picks
    among those tokens (it used to return token 0 from a NaN distribution)."""
    params = SamplingParams(temperature=1.0, repetition_penalty=5e-324)
    rows = 400
    logits = np.tile(LOGITS, (rows, 1))
    generators = [np.random.default_rng(seed) for seed in range(rows)]
    tokens, _ = Sampler()(logits, [params] * rows, [((2, 3), ())] * rows, generators)
    assert set(tokens.tolist()) == {2, 3}  # the two seen tokens with positive logits, both drawn


def test_seeded_rows_do_not_depend_on_the_batch():
    p = SamplingParams(temperature=0.9, top_p=0.95, seed=123)
    other = SamplingParams(temperature=1.3, top_k=4)
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(20, 6, 64)).astype(np.float32)
    alone_gen, batch_gen, shared = np.random.default_rng(123), np.random.default_rng(123), np.random.default_rng(9)
    alone, batched = [], []
    for step in range(20):
        alone.append(Sampler()(logits[step, :1], [p], [((), ())], [alone_gen])[0][0])
        # the seeded row sits third in a batch of six with unseeded neighbours
        rows = logits[step, [1, 2, 0, 3, 4, 5]]
        params = [other, other, p, other, other, other]
        gens = [shared, shared, batch_gen, shared, shared, shared]
        batched.append(Sampler()(rows, params, [((), ())] * 6, gens)[0][2])
    assert alone == batched


def test_logprobs_and_top_logprobs():
    logprobs = log_softmax(LOGITS[None])[0]
    np.testing.assert_allclose(np.exp(logprobs).sum(), 1.0, rtol=1e-6)
    entry = top_logprobs(logprobs, 2, 3)
    assert entry.rank == 3 and entry.top_ids == (0, 1, 2)
    assert entry.logprob == pytest.approx(float(logprobs[2]))
    assert entry.top_logprobs == pytest.approx([float(v) for v in logprobs[:3]])
    _, returned = Sampler()(LOGITS[None], [SamplingParams(temperature=0, logprobs=2)], [((), ())], [None])
    np.testing.assert_allclose(returned[0], logprobs, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"n": 0}, "n"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_invalid_parameters_name_the_parameter(kwargs, name):
    with pytest.raises(RequestError, match=name):
        SamplingParams(**kwargs)


def test_stop_accepts_a_string():
    assert SamplingParams(stop="###").stop == ("###",)


def test_penalties_cannot_ban_every_allowed_token():
    """repetition_penalty 1e300 sends a seen negative logit to -inf; when it is the only allowed
    token, the row falls back to the model's logits within the allowed set (no NaN draw)."""
    logits = np.array([[-1.0, 2.0, 3.0, 0.5]], dtype=np.float32)
    allowed = [np.array([True, False, False, False])]
    for temperature in (0.0, 1.0):
        params = SamplingParams(repetition_penalty=1e300, temperature=temperature, allowed_token_ids=(0,))
        with np.errstate(invalid="raise"):
            tokens, _ = Sampler()(logits, [params], [([0], [])], [np.random.default_rng(0)], [()], allowed)
        assert tokens.tolist() == [0]


def test_logit_bias_and_allowed_mask_by_value():
    logits = np.array([[0.0, 1.0, 2.0, 3.0]], dtype=np.float32)
    params = SamplingParams(temperature=0.0, logit_bias=((0, 10.0),))
    assert Sampler()(logits, [params], [((), ())], [np.random.default_rng(0)])[0].tolist() == [0]
    mask = [np.array([False, True, True, False])]
    assert Sampler()(logits, [SamplingParams(temperature=0.0)], [((), ())], [np.random.default_rng(0)], [()], mask)[0].tolist() == [2]
