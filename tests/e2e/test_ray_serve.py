"""`ortinf serve --ray`: replicas behind Ray Serve's HTTP proxy, on a local Ray cluster that the test
starts (with the server) and stops, on 127.0.0.1 only."""

from __future__ import annotations

import os

import httpx
import openai
import pytest

import ortinf
from ortinf.runtime.sampling_params import SamplingParams
from server_helpers import metric, running_server

pytestmark = pytest.mark.slow
PROMPTS = ["the quick brown fox", "paged attention keeps keys", "12, 345 and 6789", "a small cat watches"]


@pytest.fixture(scope="module")
def ray_server(chat_package, tmp_path_factory):
    pytest.importorskip("ray.serve")
    args = [str(chat_package), "--ray", "--num-replicas", "2", "--cpus-per-replica", "0.5", "--intra-op-threads", "1",
            "--kv-cache-memory", "64MiB", "--metrics-prefix", "vllm"]
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": "local"}
    with running_server(args, tmp_path_factory.mktemp("ray-logs"), env={**os.environ, **env}, timeout=300) as server:
        yield server
    assert server.process.returncode == 0, server.log()  # SIGTERM drained the replicas and stopped Ray


def test_two_replicas_serve_the_openai_api_with_the_single_process_output(ray_server, chat_package):
    client = openai.OpenAI(base_url=f"{ray_server.url}/v1", api_key="unused", max_retries=0)
    expected = [o.outputs[0].text for o in ortinf.LLM(chat_package).generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0))]
    for _ in range(2):  # several requests each: both replicas answer
        got = [client.completions.create(model="tiny-llama", prompt=p, max_tokens=12, temperature=0).choices[0].text for p in PROMPTS]
        assert got == expected
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="tiny-llama", prompt=PROMPTS[0], max_tokens=12,
                                                                            temperature=0, stream=True) if c.choices)
    assert streamed == expected[0]
    chat = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens >= 1
    text = httpx.get(f"{ray_server.url}/metrics").text  # one replica's metrics, under vLLM's names
    assert metric(text, "vllm:num_requests_waiting") == 0 and "vllm:kv_cache_usage_perc" in text
    assert httpx.get(f"{ray_server.url}/load").json() == {"server_load": 0}
