"""Driving a real LLMEngine step by step, with the pool invariants checked after every step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ortinf.runtime.config import EngineConfig
from ortinf.runtime.engine import LLMEngine
from ortinf.runtime.outputs import RequestOutput
from ortinf.runtime.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


def make_engine(package: Path, **options) -> LLMEngine:
    options.setdefault("num_blocks", 512)
    return LLMEngine(EngineConfig(package_dir=package, provider="cpu", **options))


def run_to_completion(
    engine: LLMEngine,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams = GREEDY,
    on_step: Callable[[int], None] | None = None,
) -> dict[str, RequestOutput]:
    """Submits all prompts, steps until done, checks invariants each step; all blocks end free."""
    ids = [engine.add_request(list(p), params) for p in prompts]
    return drain(engine, ids, on_step)


def drain(engine: LLMEngine, ids: Sequence[str], on_step: Callable[[int], None] | None = None) -> dict[str, RequestOutput]:
    finished: dict[str, RequestOutput] = {}
    step = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
        engine.check_invariants()
        step += 1
        if on_step is not None:
            on_step(step)
        assert step < 10_000, "engine does not make progress"
    assert engine.kv_cache.num_free_blocks == engine.kv_cache.pool.num_blocks, "blocks leaked"
    assert not engine.kv_cache.req_to_blocks
    return finished


def hf_greedy(model, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation, batch 1, stopping at EOS like the engine."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(prompt)]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
