"""`ortinf generate`: one request through the engine, its text streamed to the terminal."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from ortinf.cli.serve_options import SINGLE_STREAM_EXCLUDED, engine_options, engine_values


def stream_generation(package: Path, prompt: str | list[int], engine_options: dict[str, Any], params: dict[str, Any]) -> None:
    """Prints the continuation as it is generated, then one line of figures on stderr. `engine_options`:
    EngineConfig's keyword arguments (one sequence: max_num_seqs 1)."""
    from ortinf.config import EngineConfig
    from ortinf.runtime.engine.llm_engine import LLMEngine
    from ortinf.runtime.sample.sampling_params import SamplingParams
    from ortinf.tasks import driver
    from ortinf.tasks.programs import Samples

    sampling = SamplingParams(**params)
    config = EngineConfig(package_dir=package, **{**engine_options, "max_num_seqs": 1})
    engine = LLMEngine(config)
    start = time.monotonic()
    output = None
    for _, _, output in driver.steps(engine, [Samples([engine.prepare(prompt, sampling, output_kind="delta")], keep=False)]):
        completion = output.outputs[0]  # deltas: each output holds only the new tokens and text (a failed step raises)
        if engine.tokenizer:
            sys.stdout.write(completion.text)
        elif completion.token_ids:
            sys.stdout.write((" " if output.num_output_tokens > len(completion.token_ids) else "") + " ".join(map(str, completion.token_ids)))
        sys.stdout.flush()
    sys.stdout.write("\n")
    if output is not None:
        completion = output.outputs[0]
        count = output.num_output_tokens
        elapsed = time.monotonic() - start
        ttft = (output.metrics.first_token_time or start) - output.metrics.arrival_time
        print(
            f"[{count} tokens in {elapsed:.2f}s, {count / max(elapsed, 1e-9):.1f} tok/s, "
            f"first token {ttft * 1000:.0f} ms, finish: {completion.finish_reason}]",
            file=sys.stderr,
        )


@click.command()
@click.argument("package", required=False)
@click.option("-p", "--prompt", help="Prompt text.")
@click.option("--prompt-ids", help="Prompt as comma-separated token ids (for packages without a tokenizer).")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=64, show_default=True, help="Most tokens to generate.")
@click.option("-t", "--temperature", type=click.FloatRange(0.0, 2.0), default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True, help="Nucleus sampling mass.")
@click.option("--top-k", type=click.IntRange(min=-1), default=0, show_default=True, help="Sample among the k most likely tokens (0: all).")
@click.option("--min-p", type=click.FloatRange(0.0, 1.0), default=0.0, show_default=True, help="Drop tokens below min_p x the top probability.")
@click.option("--repetition-penalty", type=click.FloatRange(min=0.0, min_open=True), default=1.0, show_default=True,
              help="vLLM's repetition penalty.")
@click.option("--seed", type=int, default=None, help="Makes sampling reproducible.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@engine_options(exclude=SINGLE_STREAM_EXCLUDED)
def generate(package: str | None, prompt: str | None, prompt_ids: str | None, max_tokens: int, temperature: float, top_p: float,
             top_k: int, min_p: float, repetition_penalty: float, seed: int | None, stop: tuple[str, ...], ignore_eos: bool,
             **engine_given: object) -> None:
    """Generate a continuation of a prompt with a text-generation PACKAGE, streaming it to the terminal.

    PACKAGE is a folder made by `ortinf export`, a Hugging Face model folder (exported into the package
    cache on first use), or a bundled model's name; default: the bundled demo llama (ortinf-demo-llama)."""
    from ortinf.bundled import resolve_package

    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("pass exactly one of --prompt and --prompt-ids")
    stream_generation(
        resolve_package(package), prompt if prompt is not None else _parse_ids(prompt_ids or ""), engine_values(engine_given),
        dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
             repetition_penalty=repetition_penalty, seed=seed, stop=stop, ignore_eos=ignore_eos),
    )


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError as exc:
        raise click.BadParameter("write token ids as comma-separated integers, e.g. 1,15,2043", param_hint="--prompt-ids") from exc
