"""The server under load and faults: many streams, a flood past the queue, disconnects, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import openai
import pytest
from support.server_helpers import metric, running_server


def test_64_concurrent_streams_get_exact_token_counts(llama_server):
    client = openai.AsyncOpenAI(base_url=f"{llama_server.url}/v1", api_key="unused", max_retries=0)

    async def one(i: int) -> tuple[int, int]:
        wanted = 4 + i % 9
        stream = await client.completions.create(model="tiny-llama", prompt=f"request {i} the quick", max_tokens=wanted,
                                                 temperature=0.7, seed=i, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
        return wanted, usage.completion_tokens

    async def main():
        results = await asyncio.gather(*(one(i) for i in range(64)))
        await client.close()
        return results

    results = asyncio.run(main())
    assert all(wanted == got for wanted, got in results), results
    assert httpx.get(f"{llama_server.url}/health").status_code == 200


def test_flood_beyond_the_queue_gets_429_and_nothing_admitted_is_lost(chat_package, tmp_path):
    args = [str(chat_package), "--max-num-seqs", "2", "--max-queued-requests", "2", "--kv-cache-memory", "16MiB"]
    with running_server(args, tmp_path) as server:
        async def one(client: httpx.AsyncClient, i: int) -> httpx.Response:
            return await client.post("/v1/completions", json={"prompt": f"flood {i}", "max_tokens": 40, "ignore_eos": True})

        async def main():
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                return await asyncio.gather(*(one(client, i) for i in range(24)))

        started = time.monotonic()
        responses = asyncio.run(main())
        statuses = [r.status_code for r in responses]
        assert statuses.count(429) >= 1 and statuses.count(200) >= 4 and set(statuses) <= {200, 429}
        for response in responses:
            if response.status_code == 429:
                assert response.headers["retry-after"] == "1"
                assert response.json()["error"]["type"] == "rate_limit_error"
            else:
                assert response.json()["usage"]["completion_tokens"] == 40  # admitted ones all ran to the end
        assert time.monotonic() - started < 120
        assert httpx.get(f"{server.url}/health").status_code == 200


def idle(url: str, timeout: float = 10.0) -> str:
    """Waits until the metrics show no running or waiting request; returns the metrics text."""
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{url}/metrics").text
        if metric(text, "ortinf:num_requests_running") == 0 and metric(text, "ortinf:num_requests_waiting") == 0:
            return text
        assert time.monotonic() < deadline, text
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_frees_everything(llama_server, stream):
    # 16 samples x 500 tokens: long enough on the tiny model that the client leaves first
    body = {"prompt": "the quick brown fox", "max_tokens": 500, "n": 16, "ignore_eos": True, "stream": stream}
    aborted_before = aborted(httpx.get(f"{llama_server.url}/metrics").text)
    with httpx.Client(base_url=llama_server.url, timeout=1.0) as client:
        if stream:
            with client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        break  # one chunk, then the client goes away
        else:
            with pytest.raises(httpx.ReadTimeout):
                client.post("/v1/completions", json=body, timeout=0.2)
    text = idle(llama_server.url)
    assert metric(text, "ortinf:kv_cache_usage_perc") == 0.0
    assert aborted(text) - aborted_before == 16  # every sample of the request was aborted


def aborted(text: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith("ortinf:request_success_total") and 'finished_reason="abort"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_metrics_count_what_happened(llama_server):
    before = httpx.get(f"{llama_server.url}/metrics").text
    response = httpx.post(f"{llama_server.url}/v1/completions", json={"prompt": "metrics please", "max_tokens": 7, "ignore_eos": True})
    usage = response.json()["usage"]
    after = idle(llama_server.url)
    assert metric(after, "ortinf:generation_tokens_total") - metric(before, "ortinf:generation_tokens_total") == 7
    assert metric(after, "ortinf:prompt_tokens_total") - metric(before, "ortinf:prompt_tokens_total") == usage["prompt_tokens"]
    for name in ("ortinf:time_to_first_token_seconds_count", "ortinf:e2e_request_latency_seconds_count",
                 "ortinf:request_queue_time_seconds_count"):
        assert metric(after, name) - metric(before, name) == 1
    assert metric(after, "ortinf:inter_token_latency_seconds_count") - metric(before, "ortinf:inter_token_latency_seconds_count") == 6
    for name in ("ortinf:prefix_cache_queries_total", "ortinf:prefix_cache_hits_total", "ortinf:num_preemptions_total"):
        metric(after, name)


def test_sigterm_drains_in_flight_requests(chat_package, tmp_path):
    with running_server([str(chat_package), "--shutdown-timeout", "30"], tmp_path) as server:
        chunks = []
        with httpx.Client(base_url=server.url, timeout=60) as client:
            body = {"prompt": "drain me", "max_tokens": 300, "ignore_eos": True, "stream": True}
            with client.stream("POST", "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data:") and line != "data: [DONE]":
                        chunks.append(json.loads(line[5:]))
                        if len(chunks) == 3:
                            server.process.send_signal(signal.SIGTERM)  # mid-stream
                    elif line == "data: [DONE]":
                        chunks.append("done")
        assert chunks[-1] == "done" and chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert server.process.wait(30) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.url}/health", timeout=2)


def test_bench_serve_reports_and_saves(llama_server, tmp_path):
    from test_cli_export import ortinf

    out = tmp_path / "bench.json"
    result = ortinf("bench", "serve", "--url", llama_server.url, "--num-prompts", "12", "--input-len", "16", "--output-len", "9",
                    "--max-concurrency", "4", "--vocab-size", "256", "--save-result", out)
    assert result.returncode == 0, result.stderr
    for label in ("request throughput", "output throughput", "TTFT", "TPOT", "ITL", "E2E latency"):
        assert label in result.stdout
    summary = json.loads(out.read_text())
    assert summary["completed"] == 12 and summary["failed"] == 0 and summary["total_output_tokens"] == 12 * 9
    assert 0 < summary["ttft_ms"]["mean"] <= summary["e2el_ms"]["mean"]
    assert summary["ttft_ms"]["mean"] < summary["e2el_ms"]["mean"]  # tokens arrive as a stream, not at the end


def test_bench_serve_picks_the_language_model_of_a_multi_model_server(chat_package, minilm_package, tmp_path):
    """The bundled demo serves a llama and an embedding model: without --model, bench uses the llama; without
    --vocab-size, its prompts are words the server tokenizes (ids below 1,000 failed every request on this 256-token
    model)."""
    from test_cli_export import ortinf

    with running_server([str(chat_package), str(minilm_package), "--kv-cache-memory", "64MiB"], tmp_path) as server:
        result = ortinf("bench", "serve", "--url", server.url, "--num-prompts", "4", "--input-len", "8", "--output-len", "5",
                        "--max-concurrency", "2")
    assert result.returncode == 0, result.stderr
    assert "completed / failed          4 / 0" in result.stdout


def test_vllm_metric_names_and_the_load_endpoint(chat_package, tmp_path):
    """--metrics-prefix vllm: the names cluster routers read (vLLM's num_requests_waiting, kv_cache_usage_perc);
    /load counts requests in flight."""
    with running_server([str(chat_package), "--metrics-prefix", "vllm", "--kv-cache-memory", "64MiB"], tmp_path) as server:
        assert httpx.get(f"{server.url}/load").json() == {"server_load": 0}
        body = {"prompt": ["the quick brown fox"] * 8, "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            lines = response.iter_lines()  # kept: a dropped iterator closes the stream, which aborts the request
            next(lines)
            assert httpx.get(f"{server.url}/load").json() == {"server_load": 8}  # one request of 8 prompts
        text = httpx.get(f"{server.url}/metrics").text
    assert "vllm:num_requests_waiting" in text and "vllm:kv_cache_usage_perc" in text and "ortinf:" not in text
    assert metric(text, "vllm:generation_tokens_total") >= 1


def test_ray_options_are_validated():
    from ortinf.errors import ConfigError
    from ortinf.serve.ray_serve import RayOptions

    assert RayOptions(min_replicas=1, max_replicas=2).autoscaling and not RayOptions(num_replicas=3).autoscaling
    with pytest.raises(ConfigError, match="both --min-replicas and --max-replicas"):
        RayOptions(min_replicas=1)
    with pytest.raises(ConfigError, match="must not exceed"):
        RayOptions(min_replicas=3, max_replicas=2)


def test_ray_options_need_ray(chat_package):
    from test_cli_export import assert_user_error, ortinf

    result = ortinf("serve", chat_package, "--num-replicas", "2")
    assert result.returncode == 2 and "--num-replicas needs --ray" in result.stderr
    assert_user_error(ortinf("serve", chat_package, "--ray", "--min-replicas", "2"), "needs both --min-replicas and --max-replicas")
