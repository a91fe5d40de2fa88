"""The model runner alone, driven by hand-built SchedulerOutputs (no scheduler, no engine) on a real
decoder graph: it samples transformers' greedy tokens for a batch of prefills and then decodes, skips
unsampled chunks, returns prompt logprobs by position, and puts back what its sampling advanced when
it fails after sampling (so the engine's re-run samples the same)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_runner import ModelRunner
from ortinf.runtime.worker.scheduler_output import ScheduledRequest, SchedulerOutput

BLOCK = 16
GREEDY = SamplingParams(temperature=0, max_tokens=8)


@pytest.fixture(scope="module")
def setup(decoder_package):
    model, package = decoder_package("llama")
    return model, ModelRunner(DecoderGraph(package, num_blocks=32, block_size=BLOCK, provider="cpu"), seed=0)


def chunk(request_id: str, tokens: list[int], start: int, blocks: list[int], sample: bool = True,
          params: SamplingParams = GREEDY) -> ScheduledRequest:
    """Tokens [start, start + new) of a sequence whose tokens so far are `tokens`."""
    return ScheduledRequest(request_id=request_id, token_ids=tokens[start:], num_computed_tokens=start, block_ids=blocks,
                            sample=sample, sampling_params=params, all_token_ids=tokens, num_prompt_tokens=len(tokens),
                            num_output_tokens=0)


def step(*requests: ScheduledRequest) -> SchedulerOutput:
    return SchedulerOutput(scheduled=requests, num_scheduled_tokens=sum(len(r.token_ids) for r in requests))


def hf_next(model, tokens: list[int]) -> tuple[int, np.ndarray]:
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return int(logits[-1].argmax()), torch.log_softmax(logits, -1).numpy()


def test_a_batch_of_prefills_then_decodes_samples_transformers_tokens(setup):
    model, runner = setup
    a, b = [5, 9, 13, 200, 17], list(range(30, 50))
    out = runner.execute(step(chunk("a", a, 0, [0]), chunk("b", b, 0, [1, 2])))
    assert out.sampled_token_ids == {"a": [hf_next(model, a)[0]], "b": [hf_next(model, b)[0]]}
    a2, b2 = a + out.sampled_token_ids["a"], b + out.sampled_token_ids["b"]
    out = runner.execute(step(chunk("a", a2, len(a), [0]), chunk("b", b2, len(b), [1, 2])))  # decodes read the pool
    assert out.sampled_token_ids == {"a": [hf_next(model, a2)[0]], "b": [hf_next(model, b2)[0]]}


def test_an_unsampled_chunk_gives_no_token_and_the_next_chunk_continues_it(setup):
    model, runner = setup
    prompt = list(range(60, 100))
    out = runner.execute(step(chunk("c", prompt[:24], 0, [3, 4], sample=False)))
    assert out.sampled_token_ids == {}
    out = runner.execute(step(chunk("c", prompt, 24, [3, 4, 5])))
    assert out.sampled_token_ids == {"c": [hf_next(model, prompt)[0]]}


def test_prompt_logprobs_by_position(setup):
    model, runner = setup
    prompt = [7, 8, 9, 10, 11, 12]
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    out = runner.execute(step(chunk("p", prompt, 0, [6], params=params)))
    first, entries = out.prompt_logprobs["p"]
    _, expected = hf_next(model, prompt)
    assert first == 1 and [e.token_id for e in entries] == prompt[1:]
    assert np.allclose([e.logprob for e in entries], [expected[i, prompt[i + 1]] for i in range(len(prompt) - 1)], atol=1e-4)


def test_a_failure_after_sampling_puts_the_random_generator_back(setup, monkeypatch):
    _, runner = setup
    params = SamplingParams(temperature=1.0, seed=123, max_tokens=4, prompt_logprobs=0)
    work = step(chunk("s", [5, 6, 7, 8], 0, [7], params=params))
    with monkeypatch.context() as patch:  # prompt logprobs are computed after sampling: fail there
        patch.setattr("ortinf.runtime.worker.model_runner.prompt_logprobs", lambda *args: (_ for _ in ()).throw(RuntimeError("after sampling")))
        with pytest.raises(RuntimeError, match="after sampling"):
            runner.execute(work)
    retried = runner.execute(work).sampled_token_ids["s"]
    runner.execute(SchedulerOutput(scheduled=(), num_scheduled_tokens=0, finished_request_ids=frozenset({"s"})))  # forget its generator
    fresh = runner.execute(work).sampled_token_ids["s"]
    assert retried == fresh  # the failed call's draw was put back: the re-run samples what a first run does
