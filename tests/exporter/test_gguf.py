"""GGUF files in (issue 32, item 5, the transformers route): a GGUF written from a tiny Qwen2 model (as llama.cpp's
converter writes one) exports into a package whose greedy tokens equal transformers' on the same weights: the
original model for an F32 file, the file's dequantized weights for a Q8_0 one; `ortinf generate model.gguf` exports it
into the cache on first use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from support.gguf_files import write_gguf
from support.tiny_models import add_byte_tokenizer, build_decoder

import ortinf
from ortinf import LLM, SamplingParams

PROMPTS = [[5, 17, 200, 33, 9], [120, 7, 7, 300, 45, 61, 2, 88]]
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gguf")
    build_decoder("qwen2", root / "hf", vocab_size=392, max_position_embeddings=256)  # room for Qwen2's special tokens
    add_byte_tokenizer(root / "hf", 384)
    return root


def greedy(model: transformers.PreTrainedModel, prompt: list[int], n: int = 12) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("quantization", ["F32", "Q8_0"])
def test_a_gguf_exports_and_decodes_as_transformers_reads_it(hf, quantization):
    path = write_gguf(hf / "hf", hf / f"tiny-{quantization}.gguf", quantization)
    manifest = ortinf.export(path, hf / f"pkg-{quantization}", progress=False)
    assert manifest.task == "text-generation" and manifest.has_tokenizer
    reference = (transformers.AutoModelForCausalLM.from_pretrained(hf / "hf").eval() if quantization == "F32" else
                 transformers.AutoModelForCausalLM.from_pretrained(hf, gguf_file=path.name, dtype=torch.float32).eval())
    llm = LLM(hf / f"pkg-{quantization}", provider="cpu", num_blocks=64)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))]
    assert got == [greedy(reference, p) for p in PROMPTS]


def test_generate_on_a_gguf_file_exports_it_once(hf, tmp_path):
    path = write_gguf(hf / "hf", hf / "tiny-cli.gguf", "F32")
    ortinf_bin = str(Path(sys.executable).with_name("ortinf"))
    env = {**os.environ, "ORTINF_CACHE": str(tmp_path / "cache")}
    command = [ortinf_bin, "generate", str(path), "--prompt-ids", "5,17,200", "-n", "4", "--ignore-eos", "--provider", "cpu"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr
    assert list((tmp_path / "cache").iterdir())[0].name.startswith("tiny-cli-")
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and again.stdout == first.stdout and "exporting" not in again.stderr
