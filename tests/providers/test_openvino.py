"""The same llama package under the OpenVINO execution provider, with the same parity bound.

onnxruntime-openvino replaces the onnxruntime wheel, so the graph runs in .venv-openvino (made by
scripts/setup_openvino_env.sh; scripts/install.sh calls it) through a worker process that has
neither torch nor transformers: it is also the proof that serving needs no exporting stack.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
OV_PYTHON = ROOT / ".venv-openvino" / "bin" / "python"
WORKER = Path(__file__).with_name("openvino_worker.py")
TOLERANCE = 1e-4
BLOCK_SIZE = 4

pytestmark = pytest.mark.openvino


@pytest.fixture(scope="module")
def ov_python() -> Path:
    if not OV_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{OV_PYTHON} is missing: .ci/run must run scripts/install.sh first")
        pytest.skip("no .venv-openvino: run scripts/setup_openvino_env.sh")
    return OV_PYTHON


def test_llama_package_under_openvino(ov_python, decoder_package, tmp_path):
    model, package = decoder_package("llama")
    rng = np.random.default_rng(7)
    a, b = rng.integers(3, 256, 29).tolist(), rng.integers(3, 256, 12).tolist()
    table_a, table_b = [9, 2, 14, 5, 11, 0, 7, 3], [13, 1, 8, 6]  # shuffled, non-contiguous
    calls = [
        [[a[:20], 0, table_a]],  # prefill
        [[a[20:25], 20, table_a], [b, 0, table_b]],  # a prefill chunk beside a fresh prefill
        *[[[a[p : p + 1], p, table_a]] for p in range(25, 29)],  # decodes
    ]
    spec = {"block_size": BLOCK_SIZE, "num_blocks": 16, "calls": calls}
    (tmp_path / "calls.json").write_text(json.dumps(spec))
    out = tmp_path / "logits.npz"
    result = subprocess.run(
        [str(ov_python), str(WORKER), str(package), str(tmp_path / "calls.json"), str(out), "openvino"],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["providers"][0] == "OpenVINOExecutionProvider"
    assert report["all_nodes_on_provider"] is True  # no node silently falls back to the CPU provider
    assert report["torch_loaded"] is False

    with torch.no_grad():
        ref_a = model(torch.tensor([a])).logits[0].numpy()
        ref_b = model(torch.tensor([b])).logits[0].numpy()
    expected = [[ref_a[19]], [ref_a[24], ref_b[-1]], *[[ref_a[p]] for p in range(25, 29)]]
    got = np.load(out)
    worst = max(float(np.abs(got[f"call{i}"] - np.array(rows)).max()) for i, rows in enumerate(expected))
    assert worst <= TOLERANCE, worst
