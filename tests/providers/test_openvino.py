"""The same llama package under the OpenVINO execution provider, with the same parity bound.

onnxruntime-openvino replaces the onnxruntime wheel, so the graph runs in .venv-openvino (made by
scripts/setup_openvino_env.sh; scripts/install.sh calls it) through a worker process that has
neither torch nor transformers: it is also the proof that serving needs no exporting stack.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
OV_PYTHON = ROOT / ".venv-openvino" / "bin" / "python"
WORKER = ROOT / "hardware_matrix" / "replay.py"
TOLERANCE = 1e-4

pytestmark = pytest.mark.openvino

# hardware_matrix/ is a folder of scripts, not part of the ortinf package.
_spec = importlib.util.spec_from_file_location("replay", WORKER)
replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(replay)


@pytest.fixture(scope="module")
def ov_python() -> Path:
    if not OV_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{OV_PYTHON} is missing: .ci/run must run scripts/install.sh first")
        pytest.skip("no .venv-openvino: run scripts/setup_openvino_env.sh")
    return OV_PYTHON


def test_llama_package_under_openvino(ov_python, decoder_package, tmp_path):
    model, package = decoder_package("llama")
    spec, sequences, rows = replay.scenario(vocab_size=256)
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
        reference = [model(torch.tensor([seq])).logits[0].numpy() for seq in sequences]
    expected = [[reference[seq][pos] for seq, pos in call_rows] for call_rows in rows]
    got = np.load(out)
    worst = max(float(np.abs(got[f"call{i}"] - np.array(rows)).max()) for i, rows in enumerate(expected))
    assert worst <= TOLERANCE, worst


def test_engine_greedy_parity_under_openvino(ov_python, decoder_package, tmp_path):
    """The engine with its bound pool under OpenVINO: ragged prompts, chunked prefill, a prefix hit and
    preemption give transformers' greedy tokens."""
    from support.engine_helpers import GREEDY, hf_greedy
    from test_webgpu import parity_prompts

    model, package = decoder_package("llama")
    prompts = parity_prompts()
    engine = dict(num_blocks=14, block_size=16, max_num_batched_tokens=48, max_model_len=128)
    (tmp_path / "prompts.json").write_text(json.dumps({"prompts": prompts, "max_tokens": GREEDY.max_tokens, "engine": engine}))
    result = subprocess.run([str(ov_python), str(ROOT / "hardware_matrix" / "engine_run.py"), str(package),
                             str(tmp_path / "prompts.json"), "openvino"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["providers"][0] == "OpenVINOExecutionProvider" and report["torch_loaded"] is False
    assert report["preemptions"] > 0 and report["prefix_hits"] > 0
    assert report["tokens"] == [hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]


def test_whisper_under_openvino(ov_python, tmp_path):
    """A Whisper package's encoder and paged decoder under OpenVINO (host pool: the decoder returns its
    K/V, the cross K/V are written with numpy): the same greedy tokens as on the CPU provider, which
    tests/tasks/speech/test_transcriber.py holds equal to transformers."""
    from support.tiny_models import build_whisper

    import ortinf
    from ortinf.tasks.speech.transcriber import Transcriber

    build_whisper(tmp_path / "hf", max_target_positions=32)
    ortinf.export(tmp_path / "hf", tmp_path / "pkg", progress=False)
    rng = np.random.default_rng(0)
    audios = [(0.3 * np.sin(np.arange(n) / 9) + 0.05 * rng.standard_normal(n)).astype(np.float32) for n in (48_000, 560_000)]
    np.savez(tmp_path / "audio.npz", *audios)
    expected = Transcriber(tmp_path / "pkg").transcribe_ids(audios, max_new_tokens=10)
    code = ("import json, sys, numpy as np\nfrom ortinf.tasks.speech.transcriber import Transcriber\n"
            "audio = np.load(sys.argv[2]); t = Transcriber(sys.argv[1], provider='openvino')\n"
            "print(json.dumps({'tokens': t.transcribe_ids([audio[k] for k in sorted(audio.files)], max_new_tokens=10),"
            " 'providers': t.engine.graph.session.get_providers(), 'torch': 'torch' in sys.modules}))\n")
    result = subprocess.run([str(ov_python), "-c", code, str(tmp_path / "pkg"), str(tmp_path / "audio.npz")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["providers"][0] == "OpenVINOExecutionProvider" and report["torch"] is False
    assert report["tokens"] == expected


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl", "gemma3"])
def test_vision_language_under_openvino(ov_python, tmp_path, family):
    """issue 33: a vision-language package's vision graph and decoder (image merge; Qwen's M-RoPE deltas; Gemma 3's
    image spans) under OpenVINO: the same greedy tokens as on the CPU provider (which tests/runtime/worker/test_vision.py,
    test_qwen_vl.py and test_gemma3_vision.py hold equal to transformers). .venv-openvino has no Pillow (a serving
    install without the vision extra is tested as such): this run lends it the main environment's."""
    import io
    import sys

    from PIL import Image
    from support.tiny_models import GEMMA3_TOKENS, QWEN_VL_TOKENS, add_tokenizer, build_gemma3_vl, build_llava, build_qwen_vl

    import ortinf
    from ortinf import LLM, SamplingParams

    (tmp_path / "hf").mkdir()
    add_tokenizer(tmp_path / "hf", 280)
    if family == "llava":
        build_llava(tmp_path / "hf")
        image = [299]
    elif family == "gemma3":
        build_gemma3_vl(tmp_path / "hf")
        image = [GEMMA3_TOKENS["boi_token_index"]]
    else:
        build_qwen_vl(tmp_path / "hf", family)
        image = [QWEN_VL_TOKENS["vision_start_token_id"], QWEN_VL_TOKENS["image_token_id"], QWEN_VL_TOKENS["vision_end_token_id"]]
    ortinf.export(tmp_path / "hf", tmp_path / "pkg", progress=False)
    rng = np.random.default_rng(0)
    pictures = []
    for shape in ((40, 60, 3), (56, 50, 3)):
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(out, format="PNG")
        pictures.append(out.getvalue())
    prompts = [([2, 5, *image, 9, 11], [0]), ([2, 5, 8, 9, 30], []), ([2, *image, 12, *image, 40], [0, 1])]
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    as_inputs = [{"prompt_token_ids": ids, "multi_modal_data": {"image": [pictures[i] for i in which]}} if which else ids
                 for ids, which in prompts]
    expected = [o.outputs[0].token_ids for o in LLM(tmp_path / "pkg", provider="cpu").generate(as_inputs, greedy)]
    for i, data in enumerate(pictures):
        (tmp_path / f"{i}.png").write_bytes(data)
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    lent = tmp_path / "lent"  # the main environment's Pillow, for this process alone (same Python version)
    lent.mkdir()
    (lent / "PIL").symlink_to(Path(sys.modules["PIL"].__file__).parent)
    code = ("import json, sys, pathlib\nfrom ortinf import LLM, SamplingParams\n"
            "root = pathlib.Path(sys.argv[1]); prompts = json.loads((root / 'prompts.json').read_text())\n"
            "images = [(root / f'{i}.png').read_bytes() for i in range(2)]\n"
            "llm = LLM(root / 'pkg', provider='openvino', num_blocks=64)\n"
            "inputs = [{'prompt_token_ids': ids, 'multi_modal_data': {'image': [images[i] for i in which]}} if which else ids"
            " for ids, which in prompts]\n"
            "out = llm.generate(inputs, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))\n"
            "print(json.dumps({'tokens': [o.outputs[0].token_ids for o in out], 'providers': llm.engine.graph.session.get_providers(),"
            " 'vision': llm.engine.runner.vision.session.get_providers(), 'torch': 'torch' in sys.modules}))\n")
    result = subprocess.run([str(ov_python), "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(lent)})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["providers"][0] == report["vision"][0] == "OpenVINOExecutionProvider" and report["torch"] is False
    assert report["tokens"] == expected
