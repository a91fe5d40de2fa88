"""The bundled demo model: its training script (tiny run) and the committed checkpoint."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

import ortinf
from ortinf.bundled import DEMO_LLAMA

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_demo_model.py"


def load_script():
    spec = importlib.util.spec_from_file_location("train_demo_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_script_runs_end_to_end_tiny(tmp_path):
    out = tmp_path / "tiny-demo"
    tiny = ["--max-files", "12", "--steps", "3", "--vocab-size", "400", "--hidden-size", "32", "--intermediate-size", "64",
            "--layers", "1", "--heads", "2", "--kv-heads", "1", "--seq-len", "32", "--batch-size", "2"]
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *tiny], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "held-out loss" in result.stdout
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "README.md"):
        assert (out / name).is_file(), name
    card = (out / "README.md").read_text()
    assert "unigram baseline" in card and "Greedy completions" in card
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    assert next(model.parameters()).dtype.is_floating_point
    tokenizer = AutoTokenizer.from_pretrained(out)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == "<|user|>\nhi<|endoftext|>\n<|assistant|>\n"
    manifest = ortinf.export(out, tmp_path / "pkg", progress=False)  # the checkpoint is a normal HF folder
    assert manifest.has_chat_template and manifest.eos_token_ids == (tokenizer.eos_token_id,)


@pytest.mark.skipif(not (DEMO_LLAMA / "config.json").is_file(), reason="no committed demo checkpoint")
class TestCommittedCheckpoint:
    def test_size_and_precision(self):
        from safetensors import safe_open

        weights = DEMO_LLAMA / "model.safetensors"
        assert weights.stat().st_size <= 25 * 2**20
        with safe_open(str(weights), "np") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        assert {str(t.dtype) for t in tensors.values()} == {"float16"}
        num_params = sum(t.size for t in tensors.values())
        assert 5e6 <= num_params <= 15e6

    def test_tokenizer_round_trips_the_training_text(self):
        train_files, held_files = load_script().corpus_files()
        tokenizer = Tokenizer.from_file(str(DEMO_LLAMA / "tokenizer.json"))
        for path in train_files[::60] + held_files[:3]:
            text = path.read_text(encoding="utf-8", errors="replace")
            assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text, path

    def test_it_learned_something(self):
        figures = json.loads((DEMO_LLAMA / "training.json").read_text())
        assert figures["held_out_loss"] < figures["unigram_loss"] - 1.0
        assert figures["seconds"] < 60 * 60
