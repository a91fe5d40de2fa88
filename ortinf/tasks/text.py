"""Text generation's requests, for LLM.generate, `ortinf chat`/`generate` and every generating route alike: a
prompt's n samples prepared (tokenised, its images read, everything checked) before any of them runs, and the
program that runs them (n sampled requests, or one beam search that gives the n best)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ortinf.runtime.engine.async_engine import AsyncEngine
from ortinf.runtime.engine.llm_engine import LLMEngine
from ortinf.runtime.engine.prepared import PreparedRequest
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.tasks.beams import BeamSearches
from ortinf.tasks.programs import Program, Samples


def samples(engine: LLMEngine | AsyncEngine, prompt: Any, params: SamplingParams, n: int | None = None, *,
            output_kind: str = "final_only", **prepare: Any) -> list[PreparedRequest]:
    """The prompt's n samples (default params.n), prepared once: a beam search's n are the same request (the
    search gives the n best), sampled ones each their own seed (params.for_sample). `prepare`: LLMEngine.prepare's
    keyword arguments (lora_name, add_special_tokens, priority, cache_salt, images). Safe off the engine's thread."""
    first = _engine(engine).prepare(prompt, params, output_kind=output_kind, **prepare)
    count = params.n if n is None else n
    if first.params.num_beams > 1:
        return [first] * count
    return [replace(first, params=first.params.for_sample(j)) for j in range(count)]


def program(engine: LLMEngine | AsyncEngine, prepared: Sequence[PreparedRequest], request_id: str, keep: bool = True) -> Program:
    """The program of a request's samples (from `samples`, prompt-major): beam searches or sampled requests."""
    if prepared and prepared[0].params.num_beams > 1:
        return BeamSearches(prepared, _engine(engine), request_id)
    return Samples(prepared, keep=keep)


def _engine(engine: LLMEngine | AsyncEngine) -> LLMEngine:
    return engine.engine if isinstance(engine, AsyncEngine) else engine


__all__ = ["program", "samples"]
