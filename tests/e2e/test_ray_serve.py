"""`ortinf serve --ray`: replicas behind Ray Serve's HTTP proxy, on a local Ray cluster that the test
starts (with the server) and stops, on 127.0.0.1 only."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import httpx
import openai
import pytest
from support.server_helpers import metric, running_server

import ortinf
from ortinf.runtime.sample.sampling_params import SamplingParams

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


def replica_pids() -> list[int]:
    """The Ray Serve replica processes of the ortinf deployment on this machine (one test cluster at a time)."""
    out = subprocess.run(["pgrep", "-f", "ServeReplica:ortinf"], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def stream_all(url: str, count: int, results: list) -> list[threading.Thread]:
    """`count` long streaming completions in threads; each appends (index, finished with [DONE], error)."""
    def one(index: int) -> None:
        body = {"prompt": f"request {index} " * 3, "max_tokens": 400, "ignore_eos": True, "stream": True}
        done, error = False, None
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
                for line in response.iter_lines():
                    done = done or line == "data: [DONE]"
                    if line.startswith("data: {") and '"error"' in line[:20]:
                        error = line
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        results.append((index, done, error))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


def test_a_killed_replica_fails_only_its_requests_and_is_replaced(ray_server):
    before = replica_pids()
    assert len(before) == 2
    results: list = []
    threads = stream_all(ray_server.url, 8, results)
    time.sleep(1.0)  # the streams are running on both replicas
    os.kill(before[-1], signal.SIGKILL)
    for thread in threads:
        thread.join(120)
    finished = [r for r in results if r[1] and r[2] is None]
    failed = [r for r in results if not r[1]]
    assert len(results) == 8 and finished and failed, results  # the other replica's streams went on to the end
    assert all(error for _, _, error in failed)  # each failed stream ended with an error (the proxy closed it), none hung
    assert httpx.get(f"{ray_server.url}/health").status_code == 200  # the proxy routes around the dead replica
    deadline = time.monotonic() + 90
    while len(replica_pids()) != 2 or before[-1] in replica_pids():
        assert time.monotonic() < deadline, "Ray did not replace the killed replica"
        time.sleep(1)
    client = openai.OpenAI(base_url=f"{ray_server.url}/v1", api_key="unused", max_retries=0)
    assert all(client.completions.create(model="tiny-llama", prompt=p, max_tokens=4).choices[0].text is not None for p in PROMPTS)
