"""`ortinf bench serve`: a streaming load generator for any OpenAI-compatible completions server,
reporting what `vllm bench serve` reports."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import click
import httpx


@dataclass(frozen=True, slots=True)
class BenchConfig:
    url: str
    model: str | None
    num_prompts: int
    input_len: int
    output_len: int
    max_concurrency: int
    request_rate: float = float("inf")
    vocab_size: int | None = None  # None: prompts written in words and tokenized by the server (server_prompts)
    seed: int = 0
    api_key: str | None = None


@dataclass(slots=True)
class RequestResult:
    ok: bool
    ttft: float = 0.0
    latency: float = 0.0
    output_tokens: int = 0
    itls: list[float] = field(default_factory=list)
    error: str = ""


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"mean": statistics.mean(ordered) * 1e3, "median": statistics.median(ordered) * 1e3, "p99": p99 * 1e3}


async def _one(client: httpx.AsyncClient, config: BenchConfig, prompt: list[int]) -> RequestResult:
    body = {"prompt": prompt, "max_tokens": config.output_len, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if config.model:
        body["model"] = config.model
    start = time.perf_counter()
    result = RequestResult(ok=False)
    last = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                now = time.perf_counter()
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):
                    continue
                if last is None:
                    result.ttft = now - start
                else:
                    result.itls.append(now - last)
                last = now
        result.latency = time.perf_counter() - start
        result.ok = result.output_tokens > 0
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


WORD_LETTERS = "etaoinshrdlucmfwypvbgkqjxz"


async def server_prompts(client: httpx.AsyncClient, config: BenchConfig, rng: random.Random) -> list[list[int]]:
    """`num_prompts` prompts of `input_len` token ids that the served model's own tokenizer wrote (random words sent
    to /tokenize), so every id is in its vocabulary whatever its size (ids drawn below a fixed bound failed every
    request on a smaller model). A server without /tokenize: an error naming --vocab-size."""
    prompts = []
    for _ in range(config.num_prompts):
        words = " ".join("".join(rng.choice(WORD_LETTERS) for _ in range(rng.randint(2, 8))) for _ in range(config.input_len))
        try:
            response = await client.post("/tokenize", json={"model": config.model, "prompt": words, "add_special_tokens": False})
            ids = response.json().get("tokens") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            ids = None
        if not ids or len(ids) < config.input_len:
            raise click.ClickException(f"{config.url} did not tokenize the prompts (/tokenize): pass --vocab-size N to draw "
                                       "token ids below N instead")
        prompts.append(ids[: config.input_len])
    return prompts


async def pick_model(client: httpx.AsyncClient) -> str | None:
    """The served language model, for a server that serves several (ortinf's /v1/models says each
    model's task; elsewhere the first listed). None when the server lists none."""
    try:
        response = await client.get("/v1/models")
        models = response.json().get("data") or [] if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return None
    generators = [m for m in models if m.get("task", "text-generation") == "text-generation"]
    return (generators or models or [{}])[0].get("id")


async def run_bench(config: BenchConfig) -> dict:
    """Sends `num_prompts` streaming requests (at most `max_concurrency` at once, Poisson arrivals at
    `request_rate` per second when finite) and returns the summary. Without a model, the server's
    language model is used (pick_model)."""
    rng = random.Random(config.seed)
    limit = asyncio.Semaphore(config.max_concurrency)
    headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    limits = httpx.Limits(max_connections=config.max_concurrency + 4)
    async with httpx.AsyncClient(base_url=config.url, timeout=600, headers=headers, limits=limits) as client:
        if config.model is None:
            config = replace(config, model=await pick_model(client))
        if config.vocab_size is not None:
            prompts = [[rng.randrange(3, config.vocab_size) for _ in range(config.input_len)] for _ in range(config.num_prompts)]
        else:
            prompts = await server_prompts(client, config, rng)

        async def limited(prompt: list[int]) -> RequestResult:
            async with limit:
                return await _one(client, config, prompt)

        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(prompt)))
            if config.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(config.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "config": asdict(config) | {"request_rate": str(config.request_rate), "api_key": None},
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "request_throughput": len(done) / duration,
        "output_throughput": output_tokens / duration,
        "total_output_tokens": output_tokens,
        "ttft_ms": _percentiles([r.ttft for r in done]),
        "tpot_ms": _percentiles(tpots),
        "itl_ms": _percentiles([itl for r in done for itl in r.itls]),
        "e2el_ms": _percentiles([r.latency for r in done]),
    }


def format_summary(summary: dict) -> str:
    lines = [
        f"{'completed / failed':<28}{summary['completed']} / {summary['failed']}",
        f"{'duration (s)':<28}{summary['duration_s']:.2f}",
        f"{'request throughput (req/s)':<28}{summary['request_throughput']:.2f}",
        f"{'output throughput (tok/s)':<28}{summary['output_throughput']:.1f}",
    ]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E latency")):
        stats = summary[key]
        lines.append(f"{label + ' (ms)':<28}mean {stats['mean']:.1f}  median {stats['median']:.1f}  p99 {stats['p99']:.1f}")
    for error in summary["errors"]:
        lines.append(f"error: {error}")
    return "\n".join(lines)


@click.group()
def bench() -> None:
    """Benchmarks (see also the scripts in benchmarks/)."""


@bench.command("serve")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, help="Server base URL (without /v1).")
@click.option("--model", default=None, help="The `model` field to send [default: the server's language model].")
@click.option("--num-prompts", type=click.IntRange(min=1), default=64, show_default=True, help="Requests to send.")
@click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True, help="Prompt length in tokens (random ids).")
@click.option("--output-len", type=click.IntRange(min=1), default=128, show_default=True, help="Tokens to generate per request (ignore_eos).")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=8, show_default=True, help="Most requests in flight at once.")
@click.option("--request-rate", type=click.FloatRange(min=0.0, min_open=True), default=float("inf"), show_default=True,
              help="Poisson arrivals per second (inf: all at once).")
@click.option("--vocab-size", type=click.IntRange(min=4), default=None,
              help="Draw prompt token ids below this [default: random words tokenized by the server's /tokenize, so every id "
                   "is in the model's vocabulary].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompts and arrivals.")
@click.option("--api-key", envvar="ORTINF_API_KEY", default=None, help="Bearer key, if the server wants one.")
@click.option("--save-result", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write the summary as JSON here.")
def bench_serve(url: str, model: str | None, num_prompts: int, input_len: int, output_len: int, max_concurrency: int,
                request_rate: float, vocab_size: int | None, seed: int, api_key: str | None, save_result: Path | None) -> None:
    """Stream requests at a running server; report throughput and TTFT/TPOT/ITL/E2E latency (mean, median, p99)."""
    import asyncio
    import json


    config = BenchConfig(url.rstrip("/"), model, num_prompts, input_len, output_len, max_concurrency, request_rate, vocab_size, seed, api_key)
    summary = asyncio.run(run_bench(config))
    click.echo(format_summary(summary))
    if save_result is not None:
        save_result.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if summary["completed"] == 0:
        raise click.ClickException(f"no request succeeded against {url}: {'; '.join(summary['errors']) or 'no response'}")
