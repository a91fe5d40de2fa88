"""A soak (slow suite): 20 minutes of mixed traffic against one real server.

Streaming and not, clients that vanish mid-stream, 429 floods past the queue, chat, embeddings and
invalid requests, all at once. Every request must end in 2xx, 4xx or 429; the server's RSS, sampled
each minute, must stay within 5% of its value after the first two minutes; at the end the metrics
are idle (nothing running, waiting or admitted, no KV block in use) and a greedy request still
returns the reference text. ORTINF_SOAK_SECONDS shortens it for a try; ORTINF_SOAK_REPORT names a
JSON file for the figures (docs/robustness.md records a run).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import time
from pathlib import Path

import httpx
import pytest
from support.server_helpers import metric, running_server

from ortinf import LLM, SamplingParams

DURATION = float(os.environ.get("ORTINF_SOAK_SECONDS", "1200"))
SAMPLE_EVERY = min(60.0, DURATION / 10)
WARMUP_SAMPLES = 2  # RSS is compared with its value after the first two samples (minutes)
RSS_TOLERANCE = 0.05
WORDS = "the quick brown fox jumps over the lazy dog while a small cat watches paged attention blocks".split()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Traffic:
    """The mixed clients; `counts[(kind, outcome)]` tallies how each request ended."""

    def __init__(self, url: str, deadline: float, seed: int = 0) -> None:
        self.url, self.deadline = url, deadline
        self.rng = random.Random(seed)
        self.counts: collections.Counter = collections.Counter()

    def text(self, low: int = 2, high: int = 40) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(low, high)))

    def record(self, kind: str, status: int | str) -> None:
        self.counts[(kind, status)] += 1

    async def loop(self, kind: str, one) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=120) as client:
            while time.monotonic() < self.deadline:
                try:
                    await one(client)
                except httpx.TransportError as exc:  # never expected: the server must always answer
                    self.record(kind, f"transport:{type(exc).__name__}")

    async def completion(self, client: httpx.AsyncClient) -> None:
        body = {"model": "tiny-llama", "prompt": self.text(), "max_tokens": self.rng.randint(1, 64),
                "temperature": self.rng.choice([0, 0.7, 1.0]), "seed": self.rng.randint(-5, 5)}
        if self.rng.random() < 0.3:
            body.update(echo=True, logprobs=self.rng.randint(0, 3), max_tokens=self.rng.choice([0, 1]))
        response = await client.post("/v1/completions", json=body)
        self.record("completion", response.status_code)

    async def stream(self, client: httpx.AsyncClient, path: str, body: dict, kind: str, vanish_after: int | None) -> None:
        async with client.stream("POST", path, json={**body, "stream": True}) as response:
            if response.status_code != 200:
                self.record(kind, response.status_code)
                return
            events = 0
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events += 1
                    if line != "data: [DONE]" and "error" in json.loads(line[6:]):
                        self.record(kind, "error_event")
                        return
                    if vanish_after is not None and events >= vanish_after:
                        self.record(kind + "_vanished", 200)
                        return  # closing the response mid-stream: the client is gone
            self.record(kind, 200)

    async def completion_stream(self, client: httpx.AsyncClient) -> None:
        vanish = self.rng.randint(1, 8) if self.rng.random() < 0.4 else None
        body = {"model": "tiny-llama", "prompt": self.text(), "max_tokens": self.rng.randint(8, 96), "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        await self.stream(client, "/v1/completions", body, "completion_stream", vanish)

    async def chat(self, client: httpx.AsyncClient) -> None:
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": self.text()}]
        body = {"model": "tiny-llama", "messages": messages, "max_tokens": self.rng.randint(1, 48)}
        if self.rng.random() < 0.5:
            await self.stream(client, "/v1/chat/completions", body, "chat_stream", self.rng.choice([None, None, 2]))
        else:
            self.record("chat", (await client.post("/v1/chat/completions", json=body)).status_code)

    async def embeddings(self, client: httpx.AsyncClient) -> None:
        inputs = [self.text(1, 60) for _ in range(self.rng.randint(1, 64))]
        self.record("embeddings", (await client.post("/v1/embeddings", json={"model": "minilm", "input": inputs})).status_code)

    async def invalid(self, client: httpx.AsyncClient) -> None:
        body = self.rng.choice([
            {"model": "tiny-llama", "prompt": "x", "temperature": -1},
            {"model": "tiny-llama", "prompt": [5, 999999]},
            {"model": "tiny-llama", "prompt": "x", "response_format": {"type": "json_object"}},
            {"model": "tiny-llama", "prompt": "x", "max_tokens": 10**9},
            {"model": "nope", "prompt": "x"},
        ])
        self.record("invalid", (await client.post("/v1/completions", json=body)).status_code)
        await asyncio.sleep(0.2)

    async def flood(self, client: httpx.AsyncClient) -> None:
        """Every ~45 s (the first within the warm-up), 40 requests at once: past the capacity of 24, some get 429."""
        await asyncio.sleep(self.rng.uniform(30, 60) if self.counts[("flood", 200)] else 20)
        if time.monotonic() >= self.deadline:
            return
        body = {"model": "tiny-llama", "prompt": self.text(), "max_tokens": 8}
        responses = await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(40)))
        for response in responses:
            self.record("flood", response.status_code)


@pytest.mark.slow
def test_soak_mixed_traffic(chat_package, minilm_package, tmp_path):
    reference = LLM(chat_package, provider="cpu", num_blocks=64).generate(
        "the quick brown fox", SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].text
    args = [str(chat_package), str(minilm_package), "--served-model-name", "tiny-llama", "--served-model-name", "minilm",
            "--max-num-seqs", "8", "--max-queued-requests", "16", "--kv-cache-memory", "32MiB"]
    with running_server(args, tmp_path) as server:
        pid = server.process.pid
        start = time.monotonic()
        traffic = Traffic(server.url, start + DURATION)
        samples: list[tuple[float, int]] = [(0.0, rss_bytes(pid))]

        async def sample_rss() -> None:
            while time.monotonic() < traffic.deadline:
                await asyncio.sleep(SAMPLE_EVERY)
                samples.append((time.monotonic() - start, rss_bytes(pid)))

        async def main() -> None:
            clients = [traffic.loop("completion", traffic.completion) for _ in range(3)]
            clients += [traffic.loop("completion_stream", traffic.completion_stream) for _ in range(3)]
            clients += [traffic.loop("chat", traffic.chat) for _ in range(2)]
            clients += [traffic.loop("embeddings", traffic.embeddings), traffic.loop("invalid", traffic.invalid),
                        traffic.loop("flood", traffic.flood)]
            await asyncio.gather(sample_rss(), *clients)

        asyncio.run(main())

        idle = {}
        for _ in range(100):  # aborted streams are noticed within a poll or two
            text = httpx.get(f"{server.url}/metrics").text
            idle = {name: metric(text, f"ortinf:{name}") for name in
                    ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "num_requests_admitted")}
            if not any(idle.values()):
                break
            time.sleep(0.2)
        health = httpx.get(f"{server.url}/health").status_code
        greedy = httpx.post(f"{server.url}/v1/completions", timeout=60,
                            json={"model": "tiny-llama", "prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0})
        samples.append((time.monotonic() - start, rss_bytes(pid)))

    baseline = samples[min(WARMUP_SAMPLES, len(samples) - 1)][1]
    report = {
        "duration_s": DURATION, "requests": sum(traffic.counts.values()),
        "counts": {f"{kind} {status}": n for (kind, status), n in sorted(traffic.counts.items(), key=str)},
        "rss_mib": [(round(t), round(rss / 2**20, 1)) for t, rss in samples],
        "rss_drift_after_warmup": max(abs(rss - baseline) / baseline for _, rss in samples[WARMUP_SAMPLES:]),
        "idle_metrics": idle,
    }
    print(json.dumps(report, indent=1))
    if os.environ.get("ORTINF_SOAK_REPORT"):
        Path(os.environ["ORTINF_SOAK_REPORT"]).write_text(json.dumps(report, indent=1) + "\n")

    bad = {key: n for key, n in traffic.counts.items() if not (isinstance(key[1], int) and (200 <= key[1] < 300 or 400 <= key[1] < 500))}
    assert not bad, f"requests that did not end in 2xx/4xx/429: {bad}"
    assert traffic.counts[("flood", 429)] > 0 and traffic.counts[("completion_stream_vanished", 200)] > 0
    assert not any(idle.values()), f"not idle at the end: {idle}"
    assert health == 200 and greedy.status_code == 200 and greedy.json()["choices"][0]["text"] == reference
    assert report["rss_drift_after_warmup"] <= RSS_TOLERANCE, report["rss_mib"]
