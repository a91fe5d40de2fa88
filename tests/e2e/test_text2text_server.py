"""A BART package behind the real server: /v1/completions with the official openai client (text
through its tokenizer, and token ids), concurrent requests decoding together, the text engine's
fields (stream, n, logprobs, stop) on the one engine, the prompt-only ones as one-line 400s, and a
text model beside it still serving."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest
import torch
import transformers
from support.server_helpers import running_server
from support.tiny_models import add_byte_tokenizer

import ortinf
from ortinf import LLM


@pytest.fixture(scope="module")
def bart_package(tmp_path_factory):
    root = tmp_path_factory.mktemp("bart")
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=384, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                     max_position_embeddings=64, init_std=0.3)
    transformers.BartForConditionalGeneration(config).eval().save_pretrained(root / "hf")
    add_byte_tokenizer(root / "hf", 384)
    ortinf.export(root / "hf", root / "pkg", progress=False)
    return root / "pkg"


def test_text2text_completions(bart_package, chat_package, tmp_path):
    texts = ["the quick brown fox", "import json", "a"]
    expected = LLM(bart_package).text2text(texts, max_new_tokens=10)
    assert any(expected)
    with running_server([str(bart_package), str(chat_package), "--served-model-name", "bart", "--served-model-name", "text",
                         "--kv-cache-memory", "32MiB"], tmp_path) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        got = client.completions.create(model="bart", prompt=texts, max_tokens=10, temperature=0)
        assert [c.text for c in got.choices] == expected and got.usage.completion_tokens > 0
        with concurrent.futures.ThreadPoolExecutor(3) as pool:  # three requests at once, each its own answer
            alone = list(pool.map(lambda t: client.completions.create(model="bart", prompt=t, max_tokens=10, temperature=0)
                                  .choices[0].text, texts))
        assert alone == expected
        ids = LLM(bart_package).engine.tokenizer.encode(texts[0]).ids
        by_ids = httpx.post(f"{server.url}/v1/completions", json={"model": "bart", "prompt": ids, "max_tokens": 10,
                                                                  "temperature": 0}, timeout=60).json()
        assert by_ids["choices"][0]["text"] == expected[0] and by_ids["usage"]["prompt_tokens"] == len(ids)
        # issue 30: a text2text request is an ordinary engine request, so the text routes' fields work on it
        streamed = client.completions.create(model="bart", prompt=texts[0], max_tokens=10, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in streamed if c.choices) == expected[0]
        two = client.completions.create(model="bart", prompt=texts[1], max_tokens=10, temperature=0, n=2, logprobs=2)
        assert [c.text for c in two.choices] == [expected[1]] * 2 and two.choices[0].logprobs.top_logprobs
        # finding 14: max_tokens cut the output (BART forces EOS as the last token the length allows): "length"
        cut = client.completions.create(model="bart", prompt=texts[0], max_tokens=3, temperature=0)
        assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3
        for field, value in (("echo", True), ("prompt_logprobs", 1), ("response_format", {"type": "json_object"})):
            response = httpx.post(f"{server.url}/v1/completions", json={"model": "bart", "prompt": "hi", field: value}, timeout=60)
            assert response.status_code == 400 and field in response.json()["error"]["message"], response.text
        response = httpx.post(f"{server.url}/v1/completions", json={"model": "bart", "prompt": [5000]}, timeout=60)
        assert response.status_code == 400 and "token ids" in response.json()["error"]["message"]
        for body, fragment in (({"prompt": "word " * 500}, "1 to 64 tokens"), ({"prompt": "hi", "max_tokens": 0}, "max_tokens")):
            response = httpx.post(f"{server.url}/v1/completions", json={"model": "bart", **body}, timeout=60)
            assert response.status_code == 400 and fragment in response.json()["error"]["message"], response.text
        # issue 30's attack, findings 3 and 12: a lone surrogate was a 500; megabytes were tokenised on the event loop
        response = httpx.post(f"{server.url}/v1/completions", content=b'{"model": "bart", "prompt": "\\ud800"}',  # JSON's escape
                              headers={"content-type": "application/json"}, timeout=60)
        assert response.status_code == 400 and "not valid Unicode" in response.json()["error"]["message"], response.text
        response = httpx.post(f"{server.url}/v1/completions", json={"model": "bart", "prompt": "x" * 2_000_000}, timeout=60)
        assert response.status_code == 400 and "characters" in response.json()["error"]["message"], response.text
        sampled = {"model": "bart", "prompt": "hi", "max_tokens": 5, "temperature": 1.0, "seed": -1}  # any integer seed, as the text routes
        first, again = (httpx.post(f"{server.url}/v1/completions", json=sampled, timeout=60) for _ in range(2))
        assert first.status_code == 200 and first.json()["choices"][0]["text"] == again.json()["choices"][0]["text"]
        assert httpx.post(f"{server.url}/v1/completions", json={"model": "text", "prompt": "hi", "max_tokens": 2}).status_code == 200
        assert "bart" in [m.id for m in client.models.list().data]
