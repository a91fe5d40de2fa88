"""`ortinf serve` with no package: the bundled models, exported on first use, served side by side."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
import torch
from support.server_helpers import running_server

from ortinf.bundled import DEMO_LLAMA

pytestmark = pytest.mark.skipif(not (DEMO_LLAMA / "config.json").is_file(), reason="no committed demo checkpoint")
PROMPTS = ["def fibonacci(n):\n", "import os\n\n\nclass Config:\n", "    return sorted("]


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with running_server([], tmp_path_factory.mktemp("logs"), env={"ORTINF_CACHE": str(cache)}, timeout=300) as server:
        yield server, cache


def hf_greedy_text(prompt: str, max_new_tokens: int) -> tuple[str, int]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(DEMO_LLAMA)
    model = AutoModelForCausalLM.from_pretrained(DEMO_LLAMA, dtype=torch.float32).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.eos_token_id)
    new = out[0, ids.shape[1]:]
    return tokenizer.decode(new, skip_special_tokens=True), len(new)


def test_both_bundled_models_are_listed(demo_server):
    server, cache = demo_server
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert {m["id"]: m["task"] for m in models} == {"ortinf-demo-llama": "text-generation", "all-MiniLM-L6-v2": "feature-extraction"}
    assert len(list(cache.iterdir())) == 2  # both exported into the cache


def test_greedy_output_over_http_equals_transformers(demo_server):
    server, _ = demo_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    for prompt in PROMPTS:
        expected_text, expected_tokens = hf_greedy_text(prompt, 40)
        response = client.completions.create(model="ortinf-demo-llama", prompt=prompt, max_tokens=40, temperature=0)
        assert response.choices[0].text == expected_text
        assert response.usage.completion_tokens == expected_tokens


def test_requests_route_by_model_name(demo_server):
    server, _ = demo_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    vectors = client.embeddings.create(model="all-MiniLM-L6-v2", input=["a list of files", "sorted names"]).data
    assert len(vectors) == 2 and abs(np.linalg.norm(vectors[0].embedding) - 1.0) < 1e-4
    chat = client.chat.completions.create(model="ortinf-demo-llama", messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=8)
    assert chat.choices[0].message.role == "assistant"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="all-MiniLM-L6-v2", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="ortinf-demo-llama", input="x")


def test_a_second_start_reuses_the_cache(demo_server, tmp_path):
    _, cache = demo_server
    before = sorted(p.name for p in cache.iterdir())
    with running_server([], tmp_path, env={"ORTINF_CACHE": str(cache)}) as server:
        assert "exporting the bundled" not in server.log()
        assert len(httpx.get(f"{server.url}/v1/models").json()["data"]) == 2
    assert sorted(p.name for p in cache.iterdir()) == before
