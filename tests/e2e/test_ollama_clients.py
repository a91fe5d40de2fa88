"""Ollama's API (/api/*) with the clients users run, against a real server this test starts (no network): the official
`ollama` Python client, LiteLLM's ollama_chat/ and ollama/ providers (they send JSON with no Content-Type), curl as
Ollama's documentation uses it (-d with no -H: form-urlencoded), and the heartbeat of Ollama's Go client (HEAD /;
the Python client has none). tests/serve/test_ollama_api.py checks each route's behaviour in process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import httpx
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM reads its price list from the network otherwise

ASK = [{"role": "user", "content": "weather in Paris?"}]
GREEDY = {"temperature": 0, "num_predict": 8}


def test_the_ollama_client_and_the_heartbeat(byte_server, byte_model):
    import ollama

    beat = httpx.head(f"{byte_server.url}/", timeout=30)  # what `api.Client.Heartbeat` sends
    assert beat.status_code == 200 and beat.content == b""
    version = httpx.get(f"{byte_server.url}/api/version", timeout=30).json()["version"]
    assert tuple(int(part) for part in version.split(".")) >= (0, 13, 4)  # Codex's --oss ollama provider's minimum
    client = ollama.Client(host=byte_server.url)
    assert byte_model in {m.model for m in client.list().models}
    whole = client.chat(model=byte_model, messages=ASK, options=GREEDY, logprobs=True, top_logprobs=2)
    assert len(whole.logprobs) == whole.eval_count and all(len(entry.top_logprobs) == 2 for entry in whole.logprobs)
    pieces = list(client.chat(model=byte_model, messages=ASK, options=GREEDY, logprobs=True, stream=True))
    assert pieces[-1].done and pieces[-1].message.content == "" and "".join(p.message.content for p in pieces) == whole.message.content
    assert [e.token for p in pieces for e in p.logprobs or []] == [e.token for e in whole.logprobs]
    title = client.generate(model=byte_model, prompt="t" * 1000, raw=True, options={"temperature": 0, "num_predict": 1000})
    assert title.done and title.prompt_eval_count + title.eval_count <= 1024  # clipped to the context, as Ollama does


@pytest.mark.parametrize("provider", ["ollama_chat", "ollama"])
def test_litellm_ollama_providers(byte_server, byte_model, provider):
    """Both post JSON with no Content-Type header (each answer was a 400)."""
    import litellm

    fields = {"model": f"{provider}/{byte_model}", "api_base": byte_server.url, "max_tokens": 8, "temperature": 0,
              "messages": [{"role": "user", "content": "hello"}]}
    reply = litellm.completion(**fields)
    assert isinstance(reply.choices[0].message.content, str) and reply.usage.completion_tokens > 0
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in litellm.completion(**fields, stream=True))
    assert streamed == reply.choices[0].message.content


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_as_ollamas_documentation_sends_it(byte_server, byte_model):
    """`curl URL/api/generate -d '{...}'`, no -H: a form-urlencoded Content-Type on a JSON body."""
    body = json.dumps({"model": byte_model, "prompt": "why is the sky blue?", "stream": False, "options": GREEDY})
    done = subprocess.run(["curl", "-sS", f"{byte_server.url}/api/generate", "-d", body], capture_output=True, text=True, timeout=60,
                          check=True)
    answer = json.loads(done.stdout)
    assert answer["done"] and isinstance(answer["response"], str), done.stdout
    lines = subprocess.run(["curl", "-sS", f"{byte_server.url}/api/chat", "-d", json.dumps({"model": byte_model, "messages": ASK,
                                                                                           "options": GREEDY})],
                           capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert json.loads(lines[-1])["done"] and all(not json.loads(line)["done"] for line in lines[:-1])
    broken = subprocess.run(["curl", "-sS", f"{byte_server.url}/api/generate", "-d", "model=x"], capture_output=True, text=True,
                            timeout=60, check=True)
    assert set(json.loads(broken.stdout)) == {"error"}
