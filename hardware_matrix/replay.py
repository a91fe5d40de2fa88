"""Replays decoder calls on one provider and saves the logits; needs only the serving install
(no torch, no transformers), so it runs in .venv-openvino too.

usage: python hardware_matrix/replay.py PACKAGE CALLS.json OUT.npz PROVIDER
CALLS.json: {"block_size": int, "num_blocks": int, "calls": [[[token_ids, num_computed, block_table], ...], ...]}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input


def scenario(vocab_size: int, seed: int = 7) -> tuple[dict, list[list[int]], list[list[tuple[int, int]]]]:
    """A fixed replay: prefill, a prefill chunk beside a fresh prefill, then 4 decodes, all through
    shuffled, non-contiguous blocks of 4 tokens.

    Returns (calls spec, the token sequences, and per call the (sequence, position) of each logits
    row), so a caller can compute the expected logits with any reference.
    """
    rng = np.random.default_rng(seed)
    a, b = rng.integers(3, vocab_size, 29).tolist(), rng.integers(3, vocab_size, 12).tolist()
    table_a, table_b = [9, 2, 14, 5, 11, 0, 7, 3], [13, 1, 8, 6]
    calls = [
        [[a[:20], 0, table_a]],
        [[a[20:25], 20, table_a], [b, 0, table_b]],
        *[[[a[p : p + 1], p, table_a]] for p in range(25, 29)],
    ]
    rows = [[(0, 19)], [(0, 24), (1, 11)], *[[(0, p)] for p in range(25, 29)]]
    return {"block_size": 4, "num_blocks": 16, "calls": calls}, [a, b], rows


def main() -> None:
    package, calls_path, out_path, provider = sys.argv[1:5]
    spec = json.loads(Path(calls_path).read_text())
    graph = DecoderGraph(package, num_blocks=spec["num_blocks"], block_size=spec["block_size"], provider=provider)
    results = {}
    for i, call in enumerate(spec["calls"]):
        chunks = [SequenceChunk(*chunk) for chunk in call]
        results[f"call{i}"] = graph.run(build_model_input(chunks, spec["block_size"]))
    np.savez(out_path, **results)
    print(json.dumps({
        "providers": graph.session.get_providers(),
        "all_nodes_on_provider": (all_nodes_on(package, graph.provider.ort_name, graph.provider.options)
                                  if graph.provider.plugin_module is None else None),
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
