"""`ortinf serve --ray --prefix-routing`: requests that share a prompt prefix land on one replica, so each
system prompt misses the prefix cache once, however many users follow (local Ray cluster, 127.0.0.1)."""

from __future__ import annotations

import os
import time

import httpx
import pytest
from support.server_helpers import running_server

from ortinf.serve.ray_routing import KEY_CHARS, routing_key

FILL = "the quick brown fox jumps over the lazy dog; " * 8


def shared_prefix_workload(url: str, systems: int = 8, users: int = 4, tag: str = "system prompt") -> tuple[int, float]:
    """(requests that missed the prefix cache, cached share of all prompt tokens) for systems x users
    requests, users in turn, each system prompt followed by one user's question."""
    misses, cached, prompt = 0, 0, 0
    for user in range(users):
        for system in range(systems):
            stamp = time.monotonic_ns() if tag != 'system prompt' else ''
            body = {"prompt": f"{tag} {system} {stamp}: {FILL}\nuser {user}: question {user * 31 + system}?\nassistant:",
                    "max_tokens": 4, "temperature": 0}
            usage = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["usage"]
            misses += usage["prompt_tokens_details"]["cached_tokens"] == 0
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            prompt += usage["prompt_tokens"]
    return misses, cached / prompt


@pytest.mark.slow
def test_shared_prefixes_stay_on_one_replica(byte_package, tmp_path):
    pytest.importorskip("ray.serve")
    args = [str(byte_package), "--ray", "--prefix-routing", "--num-replicas", "2", "--cpus-per-replica", "0.5",
            "--intra-op-threads", "1", "--kv-cache-memory", "64MiB"]
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": "local"}
    with running_server(args, tmp_path, env={**os.environ, **env}, timeout=300) as server:
        # the front's handle learns of the second replica shortly after start-up (until then every key goes
        # to the one it knows): give it that time, and warm both paths up with prompts of their own
        time.sleep(3)
        shared_prefix_workload(server.url, systems=4, users=1, tag="warm-up")
        misses, hit_rate = shared_prefix_workload(server.url)
        stream = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True}).text
    assert misses == 8, misses  # the first request of each system prompt only (random routing over 2 replicas: up to 16)
    assert hit_rate > 0.5
    assert stream.rstrip().endswith("data: [DONE]")  # streams pass through the front


def test_routing_key_by_value():
    assert routing_key(b'{"prompt": "abc"}') == "abc"
    assert routing_key(('{"prompt": "' + "x" * 1000 + '"}').encode()) == "x" * KEY_CHARS
    assert routing_key(b'{"prompt": ["first", "second"]}') == "first"
    assert routing_key(b'{"prompt": [1, 2, 3]}') == "[1, 2, 3]"
    chat = routing_key(b'{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}')
    assert chat == "system:be brief\nuser:hi\n"
    assert routing_key(b"not json") is None and routing_key(b'{"input": "x"}') is None and routing_key(b"[1]") is None
