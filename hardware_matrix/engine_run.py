"""Runs greedy requests through the engine on one provider and prints their tokens as JSON; needs
only the serving install, so it runs in .venv-openvino too (tests/providers/test_openvino.py).

usage: python hardware_matrix/engine_run.py PACKAGE PROMPTS.json PROVIDER
PROMPTS.json: {"prompts": [[ids...], ...], "max_tokens": int, "engine": {EngineConfig fields}}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ortinf.config import EngineConfig
from ortinf.runtime.engine.llm_engine import LLMEngine
from ortinf.runtime.sample.sampling_params import SamplingParams


def main() -> None:
    package, prompts_path, provider = sys.argv[1:4]
    spec = json.loads(Path(prompts_path).read_text())
    engine = LLMEngine(EngineConfig(package_dir=Path(package), provider=provider, **spec.get("engine", {})))
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
    ids = [engine.add_request(prompt, params) for prompt in spec["prompts"]]
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.error is not None:
                raise output.error
            if output.finished:
                tokens[output.request_id] = output.outputs[0].token_ids
    print(json.dumps({
        "tokens": [tokens[i] for i in ids],
        "providers": engine.graph.session.get_providers(),
        "placement": engine.graph.placement.nodes,
        "preemptions": engine.scheduler.stats.num_preemptions,
        "prefix_hits": engine.kv_cache.stats.num_hits,
        "torch_loaded": "torch" in sys.modules,
    }))


if __name__ == "__main__":
    main()
