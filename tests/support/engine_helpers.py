"""Driving a real LLMEngine step by step, with the pool invariants checked after every step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ortinf.config import EngineConfig
from ortinf.runtime.engine.llm_engine import LLMEngine
from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.runtime.sample.sampling_params import SamplingParams

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


def assert_scheduling_exact(package: Path, prompts: list[list[int]]) -> None:
    """A squeezed engine (20 blocks, 48-token steps: chunked prefills, preemption, prefix hits) gives
    the greedy tokens of an unconstrained one, for every prompt, to max_tokens or a stop."""
    free = run_to_completion(make_engine(package, num_blocks=256), prompts)
    constrained = make_engine(package, num_blocks=20, max_num_batched_tokens=48, max_model_len=256)
    squeezed = run_to_completion(constrained, prompts)
    assert constrained.scheduler.stats.num_preemptions > 0 and constrained.kv_cache.stats.num_hits > 0
    ids = [str(i) for i in range(len(prompts))]
    assert [squeezed[i].outputs[0].token_ids for i in ids] == [free[i].outputs[0].token_ids for i in ids]
    assert all(len(free[i].outputs[0].token_ids) == GREEDY.max_tokens or free[i].outputs[0].finish_reason == "stop" for i in ids)
