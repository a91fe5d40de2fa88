"""`ortinf generate`: one request through the engine, its text streamed to the terminal."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from ortinf.config import EngineConfig
from ortinf.engine.llm_engine import LLMEngine
from ortinf.sample.sampling_params import SamplingParams


def stream_generation(package: Path, prompt: str | list[int], engine_options: dict[str, Any], params: dict[str, Any]) -> None:
    """Prints the continuation as it is generated, then one line of figures on stderr. `engine_options`:
    EngineConfig's keyword arguments (one sequence: max_num_seqs 1)."""
    sampling = SamplingParams(**params, output_kind="delta")
    config = EngineConfig(package_dir=package, **{**engine_options, "max_num_seqs": 1})
    engine = LLMEngine(config)
    engine.add_request(prompt, sampling)
    start = time.monotonic()
    output = None
    while engine.has_unfinished_requests():
        for output in engine.step():  # deltas: each output holds only the new tokens and text
            if output.error is not None:  # a failed step: one line from the CLI, not a traceback
                raise output.error
            completion = output.outputs[0]
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
