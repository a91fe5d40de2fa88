"""Speculative decoding by n-gram lookup: greedy output is token-identical to transformers and to
decoding without it (ragged prompts, prefix hits, preemption, chunking); the sampling rule keeps
the distribution; seeded sampling stays seeded; rejected slots go back to the pool."""

from __future__ import annotations

import numpy as np
import pytest
from support.engine_helpers import GREEDY, drain, hf_greedy, make_engine, run_to_completion

from ortinf.config import SpeculativeConfig
from ortinf.errors import ConfigError
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.sample.speculative import draw, propose_ngram, verify

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


def make_prompts(seed: int) -> list[list[int]]:
    """Ragged random prompts, and prompts that repeat a phrase (where lookup proposes often)."""
    rng = np.random.default_rng(seed)
    plain = [rng.integers(3, 256, n).tolist() for n in (1, 5, 31, 100, 150, 220)]
    repeated = [(rng.integers(3, 256, n).tolist() * reps)[:length] for n, reps, length in ((4, 10, 40), (7, 30, 190), (12, 9, 100))]
    return plain + repeated


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request, decoder_package):
    model, package = decoder_package(request.param)
    prompts = make_prompts(5)
    expected = [hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    return package, prompts, expected


@pytest.mark.parametrize("options", [
    dict(num_blocks=512),
    dict(num_blocks=24, max_num_batched_tokens=48, max_model_len=256),  # preemption, chunked prefills, prefix hits
    dict(num_blocks=512, enable_prefix_caching=False, max_num_batched_tokens=64),
], ids=["big-pool", "squeezed", "chunked-no-cache"])
def test_greedy_is_token_identical_to_transformers(setup, options):
    package, prompts, expected = setup
    engine = make_engine(package, speculative_config=NGRAM, **options)
    finished = run_to_completion(engine, prompts)  # checks the pool's invariants every step and that no block leaks
    assert [finished[str(i)].outputs[0].token_ids for i in range(len(prompts))] == expected
    stats = engine.scheduler.spec_stats
    assert stats.num_draft_tokens > 50 and stats.num_accepted_tokens > 10, stats  # it really speculated, and some proposals held
    if options["num_blocks"] == 24:
        assert engine.scheduler.stats.num_preemptions > 0 and engine.kv_cache.stats.num_hits > 0


def test_seeded_sampling_stays_seeded_and_logprobs_follow_tokens(setup):
    package, prompts, _ = setup
    params = [SamplingParams(max_tokens=24, temperature=0.7, top_k=20, seed=i, logprobs=2) for i in range(len(prompts))]
    runs = []
    for _ in range(2):
        engine = make_engine(package, speculative_config=NGRAM)
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        outputs = {}
        while engine.has_unfinished_requests():
            outputs.update({o.request_id: o for o in engine.step() if o.finished})
        runs.append([outputs[i].outputs[0] for i in ids])
        assert engine.scheduler.spec_stats.num_drafts > 0
    assert [c.token_ids for c in runs[0]] == [c.token_ids for c in runs[1]]
    for completion in runs[0]:
        assert [entry.token_id for entry in completion.logprobs] == completion.token_ids


def test_seeded_tokens_do_not_depend_on_speculation(setup):
    """issue 30, finding 7: a seeded request's tokens were other tokens when the pool was full (no blocks,
    no proposals, fewer random draws). Each output position now draws from its own (seed, position)
    stream and verification keeps a proposal only when it equals that draw: without speculation, with
    it, and with it in a pool so small that proposals come and go, the tokens are the same."""
    package, prompts, _ = setup
    params = [SamplingParams(max_tokens=24, temperature=0.5, top_k=4, seed=100 + i) for i in range(len(prompts))]
    runs = []
    for options in (dict(num_blocks=512), dict(num_blocks=512, speculative_config=NGRAM),
                    dict(num_blocks=24, max_num_batched_tokens=48, max_model_len=256, speculative_config=NGRAM)):
        engine = make_engine(package, **options)
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        finished = drain(engine, ids)  # the pool's invariants every step, every block given back
        runs.append([finished[i].outputs[0].token_ids for i in ids])
        if "speculative_config" in options:
            assert engine.scheduler.spec_stats.num_accepted_tokens > 0
    assert runs[0] == runs[1] == runs[2]


def test_the_sampling_rule_keeps_the_distribution():
    """A point-mass draft is kept when the position's own draw equals it (probability p(d)); the first
    token's law is p, and the tokens are the draws a request without speculation would make."""
    p = np.array([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    rng = np.random.default_rng(0)
    for draft in (0, 1, 3):
        counts, kept = np.zeros(4), 0
        for _ in range(20_000):
            uniforms = rng.random(2)
            tokens = verify(np.log(p), [draft], greedy=False, sample=lambda i: draw(p[i], uniforms[i]))
            counts[tokens[0]] += 1
            kept += len(tokens) == 2
            assert tokens[0] == draw(p[0], uniforms[0])  # what the position draws without speculation
        assert np.abs(counts / counts.sum() - p[0]).max() < 0.015, (draft, counts / counts.sum())
        assert abs(kept / 20_000 - p[0, draft]) < 0.015


def test_greedy_verification_by_value():
    rows = np.array([[0, 5, 1], [9, 0, 0], [0, 0, 7]], dtype=np.float32)  # argmax 1, 0, 2
    assert verify(rows, [1, 0], greedy=True) == [1, 0, 2]  # both kept, plus the bonus
    assert verify(rows, [1, 2], greedy=True) == [1, 0]  # second rejected: the target instead
    assert verify(rows, [2, 0], greedy=True) == [1]
    assert draw(np.array([0.0, 1.0, 0.0]), 0.999) == 1 and draw(np.array([1.0, 0.0, 1.0]), 0.49) == 0 and draw(np.array([1.0, 0.0, 1.0]), 0.5) == 2


def test_ngram_proposals_by_value():
    config = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=3, prompt_lookup_min=1)
    assert propose_ngram([1, 2, 3, 4, 9, 1, 2, 3], config, 10) == [4, 9, 1]  # the longest suffix [1, 2, 3] matched
    assert propose_ngram([5, 1, 7, 6, 1, 8, 2, 9, 1], config, 10) == [8, 2, 9]  # only [1] matches: the latest with 3 tokens after
    assert propose_ngram([1, 7, 1, 8, 1], config, 10) == [7, 1, 8]  # none has 3 after it: the earliest (the longest continuation)
    assert propose_ngram([4, 4, 4, 4, 4, 4], config, 10) == [4, 4, 4]  # a loop proposes a full continuation
    assert propose_ngram([1, 2, 3, 4, 9, 1, 2, 3], config, 2) == [4, 9]  # capped by the caller's budget
    assert propose_ngram([1, 2, 3], config, 4) == []
    assert propose_ngram([7, 7], config, 4) == [7]


def test_config_is_validated():
    assert SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 2}').num_speculative_tokens == 2
    for bad, message in [('{"method": "eagle"}', "not supported"), ('{"num_speculative_tokens": 0}', "positive integer"),
                         ('{"prompt_lookup_min": 5, "prompt_lookup_max": 2}', "must not exceed"), ("[1]", "JSON object"),
                         ('{"draft_model": "x"}', "unknown key"), ("{", "not valid JSON"),
                         ('{"disable_by_batch_size": 0}', "positive integer"), ('{"model": 5}', "package folder's path")]:
        with pytest.raises(ConfigError, match=message):
            SpeculativeConfig.parse(bad)


def test_disable_by_batch_size(setup):
    """No proposals while more requests than disable_by_batch_size run; output unchanged."""
    package, prompts, _ = setup
    counts, tokens = [], []
    for limit in (None, 1):
        engine = make_engine(package, speculative_config={**NGRAM, "disable_by_batch_size": limit})
        drafted_while_busy = []
        # the last request runs on alone after the others finish: speculation resumes for it
        ids = [engine.add_request(p, GREEDY if i < len(prompts) - 1 else SamplingParams(temperature=0, max_tokens=64))
               for i, p in enumerate(prompts)]
        finished = {}
        while engine.has_unfinished_requests():
            before = engine.scheduler.spec_stats.num_drafts
            running = len(engine.scheduler.running)
            finished.update({o.request_id: o for o in engine.step() if o.finished})
            drafted_while_busy.append(running > 1 and engine.scheduler.spec_stats.num_drafts > before)
        tokens.append([finished[i].outputs[0].token_ids for i in ids])
        counts.append((engine.scheduler.spec_stats.num_drafts, any(drafted_while_busy)))
    assert tokens[0] == tokens[1]
    assert counts[0][1] and not counts[1][1] and 0 < counts[1][0] < counts[0][0]


@pytest.fixture(scope="module")
def draft_package(tmp_path_factory):
    """A one-layer random llama with the test tokenizer: a draft that agrees with nothing."""
    from support.tiny_models import add_tokenizer, build_decoder

    import ortinf

    root = tmp_path_factory.mktemp("draft")
    build_decoder("llama", root / "hf", seed=1, num_hidden_layers=1)
    add_tokenizer(root / "hf")
    ortinf.export(root / "hf", root / "pkg", progress=False)
    return root / "pkg"


@pytest.mark.parametrize("options", [dict(num_blocks=512), dict(num_blocks=24, max_num_batched_tokens=48, max_model_len=256)],
                         ids=["big-pool", "squeezed"])
def test_draft_model_greedy_is_token_identical(setup, draft_package, options):
    package, prompts, expected = setup
    for draft, min_acceptance in ((draft_package, 0.0), (package, 0.9)):  # a useless draft, and the target as its own draft
        engine = make_engine(package, speculative_config={"model": str(draft), "num_speculative_tokens": 3}, **options)
        finished = run_to_completion(engine, prompts)
        assert [finished[str(i)].outputs[0].token_ids for i in range(len(prompts))] == expected
        stats = engine.scheduler.spec_stats
        assert stats.num_drafts > 20 and stats.acceptance_rate >= min_acceptance, stats
        assert engine.draft.kv_cache.usage() == 0.0  # every draft block came back
        engine.draft.kv_cache.check_invariants()


def test_draft_model_must_share_the_tokenizer(setup, byte_package):
    package, _, _ = setup
    with pytest.raises(ConfigError, match="another tokenizer"):
        make_engine(package, speculative_config={"model": str(byte_package)})
    with pytest.raises(ConfigError, match="needs `model`"):
        SpeculativeConfig.parse({"method": "draft_model"})
