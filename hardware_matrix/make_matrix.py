"""Measures every supported decoder architecture x dtype x provider against transformers (fp32).

usage: .venv/bin/python hardware_matrix/make_matrix.py [--record]

Each tiny random-weight model (tests/support/tiny_models.py) is exported, then the replay of
hardware_matrix/replay.py runs in each environment that has a provider: .venv (cpu) and
.venv-openvino (openvino), and whatever GPU providers the local onnxruntime offers. The figure is
the max abs logit difference over all replayed calls. --record writes hardware_matrix/RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import torch

import ortinf
from ortinf.providers.registry import available

os.environ.setdefault("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", "1")  # lavapipe where there is no GPU

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
from machine import describe  # noqa: E402
from support.tiny_models import DECODERS, build_decoder  # noqa: E402

_spec = importlib.util.spec_from_file_location("replay", HERE / "replay.py")
replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay)


def environments() -> list[tuple[str, Path]]:
    """(provider, python) pairs to measure: the local providers, plus OpenVINO's own venv."""
    pairs = [(found.provider.name, Path(sys.executable)) for found in available() if found.provider.name != "openvino"]
    ov_python = ROOT / ".venv-openvino" / "bin" / "python"
    if ov_python.exists():
        pairs.append(("openvino", ov_python))
    return pairs


def measure(model, package: Path, provider: str, python: Path, work: Path) -> float:
    spec, sequences, rows = replay.scenario(model.config.vocab_size)
    (work / "calls.json").write_text(json.dumps(spec))
    out = work / f"{provider}.npz"
    subprocess.run([str(python), str(HERE / "replay.py"), str(package), str(work / "calls.json"), str(out), provider],
                   check=True, capture_output=True, text=True)
    with torch.no_grad():
        reference = [model(torch.tensor([seq])).logits[0].numpy() for seq in sequences]
    got = np.load(out)
    return max(
        float(np.abs(got[f"call{i}"].astype(np.float32) - np.array([reference[s][p] for s, p in call_rows])).max())
        for i, call_rows in enumerate(rows)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help="write hardware_matrix/RESULTS.md")
    args = parser.parse_args()
    envs = environments()
    lines = [
        "# Hardware matrix: exported graph vs transformers (fp32 reference), max abs logit difference",
        "",
        f"Tiny random-weight models from tests/support/tiny_models.py; replay: prefill, a chunk beside a fresh prefill, "
        f"4 decodes, shuffled blocks. Machine: {describe()}, onnxruntime {onnxruntime.__version__} "
        "(WebGPU: onnxruntime-ep-webgpu on Mesa lavapipe).",
        "",
        "| architecture | dtype | " + " | ".join(name for name, _ in envs) + " |",
        "|---|---|" + "---:|" * len(envs),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in DECODERS:
            work = Path(tmp) / model_type
            model = build_decoder(model_type, work / "hf")
            for dtype in ("fp32", "fp16"):
                ortinf.export(work / "hf", work / dtype, dtype=dtype, progress=False)
                figures = [measure(model, work / dtype, name, python, work) for name, python in envs]
                lines.append(f"| {model_type} | {dtype} | " + " | ".join(f"{f:.1e}" for f in figures) + " |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.record:  # replaces the parity table at the top, keeps the sections other scripts append
        results = HERE / "RESULTS.md"
        old = results.read_text(encoding="utf-8") if results.exists() else ""
        rest = old[old.index("\n## ") :] if "\n## " in old else ""
        results.write_text(text + rest, encoding="utf-8")


if __name__ == "__main__":
    main()
