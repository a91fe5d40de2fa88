"""Beam search on the one engine (ortinf/tasks/beams.py, ortinf/runtime/sample/beam_search.py): the n best
hypotheses equal transformers' generate(num_beams=k, num_return_sequences=n) token for token, with
hypotheses that end early (a stop id the random model likes), every early_stopping mode and length
penalties of both signs; beams batch with sampled requests, survive a pool that preempts, and share
their history's blocks through the prefix cache."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from ortinf import LLM
from ortinf.errors import RequestError
from ortinf.runtime.sample.beam_search import BeamSearch
from ortinf.runtime.sample.sampling_params import SamplingParams

MAX_TOKENS = 12


def hf_beams(model, prompt: list[int], k: int, n: int, stop_ids: list[int], **options) -> list[list[int]]:
    """transformers' n best continuations, each cut after its first stop id (the rest is padding)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), num_beams=k,
                             num_return_sequences=n, max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=stop_ids,
                             pad_token_id=stop_ids[0], **options)
    rows = []
    for row in out[:, len(prompt):].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
        rows.append(row[:end])
    return rows


@pytest.fixture(scope="module")
def llama(decoder_package):
    model, package = decoder_package("llama")
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 250, n).tolist() for n in (5, 19, 33, 8)]
    llm = LLM(package, block_size=16)
    # the stop id: the token the model's beams pick most, so that hypotheses end at different lengths
    outs = llm.generate(prompts, SamplingParams(num_beams=4, n=4, max_tokens=MAX_TOKENS))
    counts = collections.Counter(t for o in outs for c in o.outputs for t in c.token_ids)
    return model, package, llm, prompts, counts.most_common(1)[0][0]


@pytest.mark.parametrize(("k", "n", "length_penalty", "early_stopping"),
                         [(4, 4, 1.0, False), (3, 2, 0.5, True), (4, 3, 2.0, "never"), (2, 1, -1.0, False)])
def test_beams_equal_transformers(llama, k, n, length_penalty, early_stopping):
    model, _, llm, prompts, stop = llama
    eos = model.config.eos_token_id
    params = SamplingParams(num_beams=k, n=n, max_tokens=MAX_TOKENS, length_penalty=length_penalty, early_stopping=early_stopping,
                            stop_token_ids=[stop])
    outputs = llm.generate(prompts, params)
    ended = 0
    for prompt, output in zip(prompts, outputs):
        expected = hf_beams(model, prompt, k, n, [eos, stop], length_penalty=length_penalty, early_stopping=early_stopping)
        assert [c.token_ids for c in output.outputs] == expected
        assert [c.index for c in output.outputs] == list(range(n))
        for c in output.outputs:
            assert c.finish_reason == ("stop" if c.token_ids[-1] in (eos, stop) else "length")
            assert c.stop_reason == (stop if c.finish_reason == "stop" and c.token_ids[-1] == stop else None)
            ended += c.finish_reason == "stop"
    if (k, n) == (3, 2):
        assert ended  # some hypotheses did end early: the stopping rules were exercised


def test_beams_batch_with_sampled_requests_through_preemption(llama):
    model, package, _, prompts, _ = llama
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    beams = SamplingParams(num_beams=4, n=2, max_tokens=MAX_TOKENS)
    alone = LLM(package, block_size=4)
    expected_greedy = [o.outputs[0].token_ids for o in alone.generate(prompts, greedy)]
    expected_beams = [[c.token_ids for c in o.outputs] for o in alone.generate(prompts, beams)]
    # three slots and a pool too small for four beams of the longest prompt at once: steps preempt
    tight = LLM(package, block_size=4, num_blocks=18, max_num_seqs=3, max_model_len=64)
    mixed = tight.generate(prompts + prompts, [beams] * len(prompts) + [greedy] * len(prompts))
    assert [[c.token_ids for c in o.outputs] for o in mixed[: len(prompts)]] == expected_beams
    assert [o.outputs[0].token_ids for o in mixed[len(prompts):]] == expected_greedy
    assert tight.engine.scheduler.stats.num_preemptions > 0
    kv = tight.engine.kv_cache
    assert kv.num_free_blocks == kv.pool.num_blocks and not kv.req_to_blocks  # every step request gave its blocks back
    assert expected_beams[0][0] == hf_beams(model, prompts[0], 4, 1, [model.config.eos_token_id])[0]


def test_beams_share_their_history_through_the_prefix_cache(llama):
    """Each step request finds its beam's history in the cache: the full blocks by reference, and the last,
    partly filled block of the step that extended the same beam, taken over whole (so, with 16-token blocks,
    more than the ~75% that full blocks alone give on this 33-token prompt)."""
    _, package, _, prompts, _ = llama
    params = SamplingParams(num_beams=4, n=1, max_tokens=MAX_TOKENS)
    llm = LLM(package, block_size=16)
    expected = llm.generate([prompts[2]], params)[0].outputs[0].token_ids
    stats = llm.engine.kv_cache.stats
    assert stats.num_hits / stats.num_queries > 0.85
    llm.engine.check_invariants()
    off = LLM(package, block_size=16, enable_prefix_caching=False)
    assert off.generate([prompts[2]], params)[0].outputs[0].token_ids == expected


def test_beam_text_and_usage(llama):
    _, _, llm, prompts, _ = llama
    (output,) = llm.generate([prompts[0]], SamplingParams(num_beams=3, n=3, max_tokens=MAX_TOKENS))
    tokenizer = llm.engine.tokenizer
    for c in output.outputs:
        assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)


@pytest.mark.parametrize(("options", "param"), [
    (dict(num_beams=2, n=3), "n"),
    (dict(num_beams=2, stop=["x"]), "stop"),
    (dict(num_beams=2, logprobs=1), "logprobs"),
    (dict(num_beams=2, repetition_penalty=1.2), "repetition_penalty,"),
    (dict(num_beams=0), "num_beams"),
    (dict(num_beams=64), "num_beams"),
    (dict(num_beams=2, early_stopping="sometimes"), "early_stopping"),
    (dict(num_beams=2, length_penalty=float("nan")), "length_penalty"),
    (dict(num_beams=2, length_penalty=-1e308), "length_penalty"),  # length ** -1e308 is 0.0: a division by zero
    (dict(num_beams=2, max_tokens=0), "max_tokens"),
])
def test_what_beams_cannot_do_is_refused(options, param):
    with pytest.raises(RequestError) as caught:
        SamplingParams(**options)
    assert caught.value.param == param


def test_search_rules_by_hand():
    """Two beams, one stop id: the selection steps as transformers' would."""
    search = BeamSearch(2, max_tokens=3, stop_ids=[0])
    assert search.num_candidates == 4
    search.advance([[(5, -0.1), (0, -0.5), (6, -1.0), (7, -3.0)]])
    # 0 (rank 1 < 2) ends a hypothesis of length 1; 5 and 6 go on
    assert [b.token_ids for b in search.beams] == [(5,), (6,)]
    assert [(h.token_ids, h.score) for h in search.hypotheses] == [((0,), -0.5)]
    search.advance([[(0, -0.2), (8, -0.3)], [(9, -0.01)]])
    assert [b.token_ids for b in search.beams] == [(5, 8), (6, 9)]
    assert search.hypotheses[0].token_ids == (5, 0) and search.hypotheses[0].score == pytest.approx(-0.15)
    assert not search.done
    search.advance([[(1, -0.1)], [(2, -0.1)]])  # max_tokens: the best two continuations end as hypotheses
    assert search.done
    assert [h.token_ids for h in search.best(2)] == [(5, 0), (5, 8, 1)]
