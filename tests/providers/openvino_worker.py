"""Runs inside .venv-openvino (no torch, no transformers): replays decoder calls on a provider.

usage: python openvino_worker.py PACKAGE CALLS.json OUT.npz PROVIDER
CALLS.json: {"block_size": int, "num_blocks": int, "calls": [[[token_ids, num_computed, block_table], ...], ...]}
"""

from __future__ import annotations

import json
import sys

import numpy as np
import onnxruntime as ort

from ortinf.runtime.decoder_graph import DecoderGraph
from ortinf.runtime.model_input import SequenceChunk, build_model_input


def main() -> None:
    package, calls_path, out_path, provider = sys.argv[1:5]
    spec = json.loads(open(calls_path).read())
    graph = DecoderGraph(package, num_blocks=spec["num_blocks"], block_size=spec["block_size"], provider=provider)
    results = {}
    for i, call in enumerate(spec["calls"]):
        chunks = [SequenceChunk(*chunk) for chunk in call]
        results[f"call{i}"] = graph.run(build_model_input(chunks, spec["block_size"]))
    np.savez(out_path, **results)
    print(json.dumps({
        "providers": graph.session.get_providers(),
        "all_nodes_on_provider": all_nodes_on(package, graph.provider.ort_name, graph.provider.options),
        "torch_loaded": "torch" in sys.modules,
    }))


def all_nodes_on(package: str, ort_name: str, options: dict) -> bool:
    """Whether the provider takes every node (a session with CPU fallback disabled can be built)."""
    session_options = ort.SessionOptions()
    session_options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        ort.InferenceSession(f"{package}/model.onnx", session_options, providers=[(ort_name, options)])
    except Exception:  # noqa: BLE001 - ORT raises a bare Fail here
        return False
    return True


if __name__ == "__main__":
    main()
