"""--prefix-cache-dir through the server: a long system prompt's blocks, computed before a restart, are restored after
it (the restarted server's usage counts them as cached prompt tokens), and the reply's tokens are the same."""

from __future__ import annotations

import httpx
from support.server_helpers import running_server

SYSTEM = "You are a careful assistant who answers in one short sentence. " * 12  # ~750 bytes: ~46 blocks of 16


def ask(url: str) -> dict:
    body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "weather in Paris?"}],
            "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_restarted_server_restores_the_prompt(byte_package, tmp_path):
    args = [str(byte_package), "--kv-cache-memory", "64MiB", "--prefix-cache-dir", str(tmp_path / "kv")]
    with running_server(args, tmp_path) as server:
        cold = ask(server.url)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and cold["usage"]["prompt_tokens"] > 700
    with running_server(args, tmp_path) as server:  # the first one wrote its blocks as it cached them, and exited
        warm = ask(server.url)
    prompt = warm["usage"]["prompt_tokens"]
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt // 16 * 16 - (16 if prompt % 16 == 0 else 0)
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
