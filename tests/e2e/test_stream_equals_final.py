"""Property (issue 21): for random stop strings, stop token ids and max_tokens, with and without
speculative decoding, a streamed completion's deltas joined are the non-streamed answer (text, finish
reason, stop reason), and `usage` counts exactly the tokens returned (one logprobs entry per token)."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.server_helpers import running_server

from ortinf.bundled import DEMO_LLAMA

pytestmark = pytest.mark.skipif(not (DEMO_LLAMA / "config.json").is_file(), reason="no committed demo checkpoint")
PROMPTS = ["for i in range(10):\n    print(i)\n" * 6, "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", "import os\nimport sys\n"]
STOPS = ["print", "(", "\n\n", "return", "i)", "def", " ", "):\n", "zzz"]


@pytest.fixture(scope="module", params=["plain", "ngram"])
def server(request, demo_cache, tmp_path_factory):
    args = [str(DEMO_LLAMA), "--served-model-name", "demo"]
    if request.param == "ngram":
        args += ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4})]
    with running_server(args, tmp_path_factory.mktemp("logs"), env={"ORTINF_CACHE": str(demo_cache)}, timeout=300) as running:
        yield running


def streamed(url: str, body: dict) -> tuple[str, list, str | None, object, dict]:
    text, logprobs, finish, stop, usage = "", [], None, None, None
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}},
                      timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            assert "error" not in chunk, chunk
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                text += choice["text"]
                if choice.get("logprobs"):
                    logprobs += choice["logprobs"]["tokens"]
                finish = choice.get("finish_reason") or finish
                stop = choice.get("stop_reason", stop) if choice.get("finish_reason") else stop
    return text, logprobs, finish, stop, usage


@settings(max_examples=12, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(prompt=st.sampled_from(PROMPTS), stop=st.lists(st.sampled_from(STOPS), max_size=3, unique=True),
       stop_ids=st.lists(st.integers(3, 8191), max_size=2), max_tokens=st.integers(1, 48))
def check(server, prompt: str, stop: list[str], stop_ids: list[int], max_tokens: int) -> None:
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0,
            "stop": stop, "stop_token_ids": stop_ids}
    whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    choice = answer["choices"][0]
    text, tokens, finish, stop_reason, usage = streamed(server.url, body)
    assert text == choice["text"] and finish == choice["finish_reason"] and stop_reason == choice.get("stop_reason")
    assert len(tokens) == len(choice["logprobs"]["tokens"]) == answer["usage"]["completion_tokens"] == usage["completion_tokens"]
    assert answer["usage"]["completion_tokens"] <= max_tokens


def test_streamed_deltas_join_to_the_answer(server):
    check(server)
