"""Engine features on a real exported llama: seeds, stop rules, logprobs, abort, admission."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from support.engine_helpers import GREEDY, drain, hf_greedy, make_engine, run_to_completion

from ortinf.errors import RequestError
from ortinf.runtime.sample.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llama(decoder_package):
    return decoder_package("llama")


def prompts(seed: int, count: int, low: int = 5, high: int = 60) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 256, int(rng.integers(low, high))).tolist() for _ in range(count)]


def test_seeded_sampling_is_reproducible_across_batches(llama):
    _, package = llama
    seeded = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=42, max_tokens=20)
    target = prompts(1, 1)[0]
    alone = run_to_completion(make_engine(package), [target], seeded)["0"].outputs[0].token_ids
    engine = make_engine(package, max_num_batched_tokens=48)
    noise = SamplingParams(temperature=1.2, max_tokens=20)
    ids = [engine.add_request(p, noise) for p in prompts(2, 5)]
    ids.insert(2, engine.add_request(target, seeded))
    ids += [engine.add_request(p, noise) for p in prompts(3, 3)]
    together = drain(engine, ids)[ids[2]].outputs[0].token_ids
    assert alone == together
    different_seed = run_to_completion(make_engine(package), [target], SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=43, max_tokens=20))
    assert different_seed["0"].outputs[0].token_ids != alone


def boundaries(engine, token_ids: list[int]) -> list[int]:
    """Character offsets where each output token's text ends."""
    ends, text = [], ""
    for i in range(1, len(token_ids) + 1):
        text = engine.tokenizer.decode(token_ids[:i])
        ends.append(len(text))
    return ends


def test_stop_string_across_token_boundary(llama):
    _, package = llama
    engine = make_engine(package)
    prompt = engine.tokenizer.encode("the quick brown fox").ids
    base = run_to_completion(engine, [prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))["0"].outputs[0]
    text, ends = base.text, boundaries(engine, base.token_ids)
    # a 4-character stop string that starts inside one token's text and ends inside a later one
    cut = next(e for e in ends[2:] if 2 <= e < len(text) - 2 and text[e - 2 : e + 2].strip() == text[e - 2 : e + 2])
    stop = text[cut - 2 : cut + 2]
    assert text.find(stop) == cut - 2, "pick a stop string that first occurs at the boundary"

    engine = make_engine(package)
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]))
    seen = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            seen.append(output.outputs[0].text)
    assert output.finished and output.outputs[0].finish_reason == "stop" and output.outputs[0].stop_reason == stop
    assert output.outputs[0].text == text[: cut - 2]
    # no streamed text ever shows any part of the stop string, and streamed text only grows
    assert all(text[: cut - 2].startswith(partial) for partial in seen)
    assert seen == sorted(seen, key=len)

    engine = make_engine(package)
    kept = run_to_completion(engine, [prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop],
                                                              include_stop_str_in_output=True))
    assert kept["0"].outputs[0].text == text[: cut + 2]


def test_stop_token_ids_and_min_tokens(llama):
    model, package = llama
    prompt = prompts(4, 1)[0]
    greedy = hf_greedy(model, prompt, 12)
    stop_id = greedy[2]
    out = run_to_completion(make_engine(package), [prompt], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_id]))["0"].outputs[0]
    assert out.token_ids == greedy[: greedy.index(stop_id) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_id], min_tokens=8)
    held = run_to_completion(make_engine(package), [prompt], params)["0"].outputs[0]
    assert len(held.token_ids) >= 8 and stop_id not in held.token_ids[:8]


def test_eos_and_ignore_eos(llama, tmp_path):
    model, package = llama
    prompt = prompts(5, 1)[0]
    greedy = hf_greedy(model, prompt, 10)
    eos = greedy[4]
    custom = tmp_path / "pkg"
    shutil.copytree(package, custom)
    manifest = json.loads((custom / "ortinf.json").read_text())
    manifest["eos_token_ids"] = [eos, 2]  # several EOS ids, as generation_config may list
    (custom / "ortinf.json").write_text(json.dumps(manifest))
    stopped = run_to_completion(make_engine(custom), [prompt], SamplingParams(temperature=0, max_tokens=10))["0"].outputs[0]
    assert stopped.token_ids == greedy[: greedy.index(eos) + 1] and stopped.finish_reason == "stop"
    ignored = run_to_completion(make_engine(custom), [prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))["0"].outputs[0]
    assert len(ignored.token_ids) == 10 and ignored.finish_reason == "length"


def test_logprobs_match_transformers(llama):
    model, package = llama
    prompt = prompts(6, 1)[0]
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=3, prompt_logprobs=2, ignore_eos=True)
    output = run_to_completion(make_engine(package, max_num_batched_tokens=16), [prompt], params)["0"]
    tokens = output.outputs[0].token_ids
    with torch.no_grad():
        reference = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0], -1).numpy()
    for i, entry in enumerate(output.outputs[0].logprobs):
        position = len(prompt) - 1 + i
        assert entry.token_id == tokens[i] and entry.rank == 1 and entry.top_ids[0] == tokens[i]
        assert abs(entry.logprob - reference[position, tokens[i]]) <= 1e-4
        assert len(entry.top_ids) == 3
    assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(prompt)
    for position in range(1, len(prompt)):
        entry = output.prompt_logprobs[position]
        assert entry.token_id == prompt[position]
        assert abs(entry.logprob - reference[position - 1, prompt[position]]) <= 1e-4
        assert len(entry.top_ids) == 2


def test_echo_with_zero_max_tokens(llama):
    _, package = llama
    prompt = prompts(7, 1)[0]
    output = run_to_completion(make_engine(package), [prompt], SamplingParams(max_tokens=0, prompt_logprobs=0))["0"]
    assert output.outputs[0].token_ids == [] and output.outputs[0].finish_reason == "length"
    assert len(output.prompt_logprobs) == len(prompt)


def test_abort_frees_blocks_at_once(llama):
    model, package = llama
    engine = make_engine(package)
    batch = prompts(8, 4, 30, 60)
    ids = [engine.add_request(p, SamplingParams(temperature=0, max_tokens=20)) for p in batch]
    early = {}
    for _ in range(3):
        early.update({o.request_id: o for o in engine.step() if o.finished})
    victim = next(i for i, request_id in enumerate(ids) if request_id in engine.kv_cache.req_to_blocks)
    held = len(engine.kv_cache.req_to_blocks[ids[victim]])
    free_before = engine.kv_cache.num_free_blocks
    aborted = engine.abort(ids[victim])
    assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
    assert 0 < len(aborted.outputs[0].token_ids) < 20  # it was mid-generation
    assert ids[victim] not in engine.kv_cache.req_to_blocks
    assert engine.kv_cache.num_free_blocks == free_before + held
    engine.check_invariants()
    finished = {**early, **drain(engine, ids)}
    for i in set(range(4)) - {victim}:
        assert finished[ids[i]].outputs[0].token_ids == hf_greedy(model, batch[i], 20)


def test_admission_rejects_what_cannot_fit(llama):
    _, package = llama
    engine = make_engine(package)
    with pytest.raises(RequestError, match=r"prompt \(500 tokens\) \+ max_tokens \(100\).*context length 512"):
        engine.add_request([5] * 500, SamplingParams(max_tokens=100))
    with pytest.raises(RequestError, match="empty"):
        engine.add_request([], GREEDY)
    with pytest.raises(RequestError, match="token ids must be in"):
        engine.add_request([5, 999], GREEDY)
    assert not engine.has_unfinished_requests() and engine.kv_cache.num_free_blocks == 512


def test_output_kinds_deltas_join_to_the_cumulative_output(decoder_package):
    """output_kind "delta": each output holds only what is new (tokens, text, logprobs), and joined
    they are the cumulative output; "final_only": one output per request, when it finishes."""

    _, package = decoder_package("llama")
    base = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1, stop=["zz"])
    outputs = {}
    for kind in ("cumulative", "delta", "final_only"):
        engine = make_engine(package)
        request_id = engine.add_request(engine.prepare([5, 6, 7, 8], base, output_kind=kind))
        steps = []
        while engine.has_unfinished_requests():
            steps += [o for o in engine.step() if o.request_id == request_id]
        outputs[kind] = steps
    cumulative, deltas, finals = outputs["cumulative"], outputs["delta"], outputs["final_only"]
    assert len(finals) == 1 and finals[0].finished and len(deltas) == len(cumulative) > 1
    joined = deltas[0]
    for delta in deltas[1:]:
        assert delta.delta and len(delta.outputs[0].token_ids) <= 1
        joined = joined.followed_by(delta)
    whole = cumulative[-1].outputs[0]
    for result in (joined.outputs[0], finals[0].outputs[0]):
        assert result.token_ids == whole.token_ids and result.text == whole.text and result.finish_reason == whole.finish_reason
        assert [e.token_id for e in result.logprobs] == [e.token_id for e in whole.logprobs]
    assert [d.num_output_tokens for d in deltas] == [len(c.outputs[0].token_ids) for c in cumulative]


def test_add_special_tokens_priority_and_cache_salt_reach_the_request(llama, tmp_path):
    _, package = llama
    custom = tmp_path / "pkg"
    shutil.copytree(package, custom)
    tokenizer = json.loads((custom / "tokenizer.json").read_text())
    tokenizer["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                             {"Sequence": {"id": "A", "type_id": 0}}],
                                   "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                                   "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    (custom / "tokenizer.json").write_text(json.dumps(tokenizer))
    engine = make_engine(custom)
    with_bos = engine.prepare("paged attention", SamplingParams(max_tokens=2)).token_ids
    bare = engine.prepare("paged attention", SamplingParams(max_tokens=2), add_special_tokens=False).token_ids
    assert with_bos == [1, *bare]
    with pytest.raises(RequestError, match="--scheduling-policy priority"):
        engine.prepare("x", SamplingParams(max_tokens=2), priority=1)
    urgent = make_engine(custom, scheduling_policy="priority")
    prepared = urgent.prepare("x", SamplingParams(max_tokens=2), priority=-3, cache_salt="t1")
    urgent.add_request(prepared, request_id="r")
    request = urgent.scheduler.requests["r"]
    assert request.priority == -3 and request.cache_salt == "salt:t1"


def test_request_options_are_the_front_ends_not_the_clients(llama):
    """RequestOptions (ortinf/runtime/sample/request_options.py): a watched token's log-probability is the model's,
    before any rule (a banned token is still watched), top_candidates makes a one-step request whose candidates are
    the best tokens under its rules, and Whisper's rules are refused on a text package."""
    from dataclasses import replace

    from ortinf.runtime.sample.request_options import RequestOptions

    _, package = llama
    engine = make_engine(package)
    plain = engine.prepare([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=1, logprobs=5))
    top = drain(engine, [engine.add_request(plain)])["0"].outputs[0].logprobs[0]
    best, second = top.top_ids[0], top.top_ids[1]
    banned = SamplingParams(temperature=0, max_tokens=1, allowed_token_ids=tuple(top.top_ids[1:]))
    watching = replace(engine.prepare([5, 6, 7, 8], banned), options=RequestOptions(watch_token_ids=(best, second)))
    one_step = replace(engine.prepare([5, 6, 7, 8], banned), options=RequestOptions(top_candidates=2))
    done = drain(engine, [engine.add_request(watching), engine.add_request(one_step)])
    watched, stepped = done["1"], done["2"]
    assert watched.outputs[0].token_ids == [second]  # the best token is not allowed ...
    assert watched.watched == pytest.approx({best: top.top_logprobs[0], second: top.top_logprobs[1]}, abs=1e-5)  # ... not its watch
    assert stepped.finished and [t for t, _ in stepped.candidates][0] == second and len(stepped.candidates) == 2
    with pytest.raises(RequestError, match="speech-recognition"):
        engine.add_request(replace(plain, options=RequestOptions(whisper_timestamps=False)))
    with pytest.raises(RequestError, match="output_kind"):
        RequestOptions(output_kind="everything")
    assert not hasattr(SamplingParams(), "output_kind") and not hasattr(SamplingParams(), "logits_processors")
