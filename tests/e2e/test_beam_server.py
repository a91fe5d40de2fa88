"""Beam search through the real server with the official openai client (vLLM's fields in extra_body):
completions and chat equal LLM.generate's beams, streamed and not; what beams cannot honour, and
the beam fields without beams, are 400s naming the field; sampled requests run beside a search."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

from ortinf import LLM
from ortinf.runtime.sample.sampling_params import SamplingParams

PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def client(llama_server):
    return openai.OpenAI(base_url=f"{llama_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def expected(chat_package):
    (output,) = LLM(chat_package).generate([PROMPT], SamplingParams(num_beams=4, n=2, max_tokens=10, length_penalty=0.5))
    return output


def test_completions_beams_equal_llm(client, expected):
    body = dict(model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=10, n=2,
                extra_body={"use_beam_search": True, "best_of": 4, "length_penalty": 0.5})
    completion = client.completions.create(**body)
    assert [c.text for c in completion.choices] == [c.text for c in expected.outputs]
    assert [c.finish_reason for c in completion.choices] == [c.finish_reason for c in expected.outputs]
    assert completion.usage.completion_tokens == sum(len(c.token_ids) for c in expected.outputs)
    assert completion.usage.prompt_tokens == len(expected.prompt_token_ids)
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(**body, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert [texts[0], texts[1]] == [c.text for c in expected.outputs]


def test_chat_beams(client):
    model = client.models.list().data[0].id
    body = dict(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, n=3, extra_body={"use_beam_search": True})
    reply = client.chat.completions.create(**body)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.message.content for c in reply.choices}) == 3  # three different hypotheses, best first
    streamed = {}
    for chunk in client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert [streamed[i] for i in range(3)] == [c.message.content for c in reply.choices]


@pytest.mark.parametrize(("extra", "param"), [
    ({"use_beam_search": True, "stop": ["x"]}, "stop"),
    ({"use_beam_search": True, "logprobs": 2}, "logprobs"),
    ({"use_beam_search": True, "frequency_penalty": 0.5}, "repetition_penalty,"),
    ({"use_beam_search": True, "n": 2, "best_of": 64}, "best_of"),
    ({"use_beam_search": True, "n": 2, "length_penalty": 1e308}, "length_penalty"),
    ({"length_penalty": 0.5}, "length_penalty"),
    ({"early_stopping": True}, "early_stopping"),
    ({"best_of": 3}, "best_of"),
])
def test_what_beams_refuse(client, extra, param):
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=4, extra_body=extra)
    assert caught.value.body["param"] == param, caught.value.body


def test_sampled_requests_run_beside_searches(client, expected):
    model = client.models.list().data[0].id
    beams = dict(model=model, prompt=PROMPT, max_tokens=10, n=2, extra_body={"use_beam_search": True, "best_of": 4, "length_penalty": 0.5})
    greedy = dict(model=model, prompt=PROMPT, max_tokens=10, temperature=0)
    alone = client.completions.create(**greedy).choices[0].text
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(client.completions.create, **(beams if i % 2 else greedy)) for i in range(6)]
        results = [f.result() for f in futures]
    for i, result in enumerate(results):
        if i % 2:
            assert [c.text for c in result.choices] == [c.text for c in expected.outputs]
        else:
            assert result.choices[0].text == alone


def test_a_client_that_leaves_ends_its_search(client, llama_server):
    """A search whose client disconnects is cancelled: its step requests are aborted and no new step starts (the
    whole search takes ~5 s here; its steps stop within 1 s of the disconnect at 1 s). Every step request ends
    within its step, so the running gauge reads 0 between steps: the prefix-cache lookups (each step request
    looks its history up) are what shows steps still starting."""
    import time

    import httpx
    from support.server_helpers import metric

    def lookups() -> float:
        return metric(httpx.get(f"{llama_server.url}/metrics").text, "ortinf:prefix_cache_queries_total")

    body = {"prompt": PROMPT, "max_tokens": 500, "n": 4, "best_of": 16, "use_beam_search": True, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{llama_server.url}/v1/completions", json=body, timeout=1.0)
    time.sleep(1.0)
    settled = lookups()
    time.sleep(1.0)
    assert lookups() == settled, "the search kept stepping after its client left"
    assert client.completions.create(model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=2).choices[0].text is not None
