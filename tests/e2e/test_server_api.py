"""The real server driven by the official `openai` client."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from ortinf import LLM, SamplingParams
from ortinf.runtime.worker.encoder_graph import EncoderGraph

PROMPTS = ["the quick brown fox", "a small cat watches", "numbers like 12"]


@pytest.fixture(scope="module")
def client(llama_server):
    return openai.OpenAI(base_url=f"{llama_server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def llm(chat_package):
    return LLM(chat_package, provider="cpu", num_blocks=256)


def test_models_list(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-llama"]


def test_greedy_completions_equal_llm_generate(client, llm):
    expected = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12))
    for prompt, reference in zip(PROMPTS, expected):
        response = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=12, temperature=0)
        choice = response.choices[0]
        assert choice.text == reference.outputs[0].text
        assert choice.finish_reason == reference.outputs[0].finish_reason
        assert response.usage.completion_tokens == len(reference.outputs[0].token_ids)
        assert response.usage.prompt_tokens == len(reference.prompt_token_ids)


def test_token_id_prompts_and_batches(client, llm):
    ids = llm.engine.tokenizer.encode(PROMPTS[0]).ids
    by_ids = client.completions.create(model="tiny-llama", prompt=ids, max_tokens=8, temperature=0)
    by_text = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(model="tiny-llama", prompt=[ids, ids[:3]], max_tokens=4, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == client.completions.create(model="tiny-llama", prompt=ids, max_tokens=4, temperature=0).choices[0].text


def test_echo_with_logprobs_for_loglikelihood(client, llm):
    """lm-eval's loglikelihood request: echo, max_tokens 0, logprobs of every prompt token."""
    response = client.completions.create(model="tiny-llama", prompt=PROMPTS[1], max_tokens=0, echo=True, logprobs=1, temperature=0)
    choice = response.choices[0]
    assert choice.text == PROMPTS[1]
    ids = llm.engine.tokenizer.encode(PROMPTS[1]).ids
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(ids) and logprobs.token_logprobs[0] is None
    expected = llm.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs=1))[0].prompt_logprobs
    np.testing.assert_allclose(logprobs.token_logprobs[1:], [e.logprob for e in expected[1:]], atol=1e-5)
    one = client.completions.create(model="tiny-llama", prompt=PROMPTS[1], max_tokens=1, echo=True, logprobs=2, temperature=0)
    assert len(one.choices[0].logprobs.tokens) == len(ids) + 1 and len(one.choices[0].logprobs.top_logprobs[-1]) == 2


def test_n_with_seed_and_stop_strings(client):
    first = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=10, n=2, seed=5, temperature=1.0)
    again = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=10, n=2, seed=5, temperature=1.0)
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert first.choices[0].text != first.choices[1].text
    full = client.completions.create(model="tiny-llama", prompt=PROMPTS[2], max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[5:8]
    cut = client.completions.create(model="tiny-llama", prompt=PROMPTS[2], max_tokens=16, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"


def test_streamed_completion_with_usage(client):
    plain = client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=10, temperature=0)
    chunks = list(client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason


def test_chat_plain_and_streamed(client, llm, chat_package):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "the lazy dog"}]}]
    response = client.chat.completions.create(model="tiny-llama", messages=messages, max_completion_tokens=12, temperature=0,
                                              logprobs=True, top_logprobs=2)
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    rendered = llm.engine.tokenizer.encode("<s>system: be brief\nuser: the lazy dog\nassistant:", add_special_tokens=False).ids
    expected = llm.generate(rendered, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0]
    assert choice.message.content == expected.text and response.usage.prompt_tokens == len(rendered)
    assert len(choice.logprobs.content) == len(expected.token_ids) and len(choice.logprobs.content[0].top_logprobs) == 2

    chunks = list(client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=12, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == expected.finish_reason
    assert chunks[-1].usage.total_tokens == len(rendered) + len(expected.token_ids)


def test_chat_template_errors_are_400(client):
    with pytest.raises(openai.BadRequestError, match="must not start with the assistant"):
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "assistant", "content": "hi"}], max_tokens=2)


def test_embeddings_float_and_base64(embed_server, minilm_package):
    client = openai.OpenAI(base_url=f"{embed_server.url}/v1", api_key="unused", max_retries=0)
    texts = ["a cat on a mat", "the stock market fell", "ONNX Runtime everywhere"]
    expected = EncoderGraph(minilm_package, provider="cpu").embed(texts)
    as_float = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    as_base64 = client.embeddings.create(model="minilm", input=texts)  # the client asks for base64 by default
    for response in (as_float, as_base64):
        got = np.array([d.embedding for d in response.data], dtype=np.float32)
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert as_float.usage.prompt_tokens > 0
    ids = EncoderGraph(minilm_package, provider="cpu").encode([texts[0]])[0]
    by_ids = client.embeddings.create(model="minilm", input=[ids], encoding_format="float")
    np.testing.assert_allclose(by_ids.data[0].embedding, expected[0], atol=1e-5)
    assert [m.id for m in client.models.list().data] == ["minilm"]
    short = client.embeddings.create(model="minilm", input=texts, encoding_format="float", dimensions=64)
    got = np.array([d.embedding for d in short.data], dtype=np.float32)
    shortened = expected[:, :64] / np.linalg.norm(expected[:, :64], axis=1, keepdims=True)  # Matryoshka, unit length again
    np.testing.assert_allclose(got, shortened, atol=1e-5)
    with pytest.raises(openai.BadRequestError, match="at most 384"):
        client.embeddings.create(model="minilm", input=texts, dimensions=385)
    with pytest.raises(openai.BadRequestError, match="does not embed|embeddings"):
        openai.OpenAI(base_url=f"{embed_server.url}/v1", api_key="x", max_retries=0).completions.create(model="minilm", prompt="x")
