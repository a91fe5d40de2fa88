"""Package layout variants: fp16 packages, weights kept as external data, tokenizer and chat template."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support.tiny_models import build_decoder
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import ortinf
from ortinf.manifest import Manifest
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"


def run_prompt(package, tokens: list[int]) -> np.ndarray:
    graph = DecoderGraph(package, num_blocks=16, block_size=4, provider="cpu")
    table = [5, 3, 11, 0, 9, 14, 2, 7]
    graph.run(build_model_input([SequenceChunk(tokens[:-1], 0, table)], 4))
    return graph.run(build_model_input([SequenceChunk(tokens[-1:], len(tokens) - 1, table)], 4))[0]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("variants") / "hf"
    model = build_decoder("llama", folder)
    tokens = np.random.default_rng(0).integers(3, 256, 20).tolist()
    with torch.no_grad():
        expected = model(torch.tensor([tokens])).logits[0, -1].numpy()
    return folder, tokens, expected


def test_fp16_package(llama, tmp_path):
    folder, tokens, expected = llama
    manifest = ortinf.export(folder, tmp_path / "pkg", dtype="fp16", progress=False)
    assert manifest.dtype == "fp16" and manifest.decoder.kv_dtype == "fp16"
    assert 0 < manifest.parity.max_abs_diff <= manifest.parity.tolerance == 5e-2
    graph = DecoderGraph(tmp_path / "pkg", num_blocks=4, block_size=4, provider="cpu")
    assert graph.read_pool(0).dtype == np.float16
    assert np.abs(run_prompt(tmp_path / "pkg", tokens) - expected).max() <= 2e-2


def test_weights_as_external_data(llama, tmp_path):
    folder, tokens, expected = llama
    ortinf.export(folder, tmp_path / "pkg", progress=False, external_data_threshold=0)
    names = sorted(p.name for p in (tmp_path / "pkg").iterdir())
    assert "model.onnx.data" in names and ".trace" not in names
    assert (tmp_path / "pkg" / "model.onnx").stat().st_size < (tmp_path / "pkg" / "model.onnx.data").stat().st_size
    assert np.abs(run_prompt(tmp_path / "pkg", tokens) - expected).max() <= 1e-4


def test_tokenizer_chat_template_and_generation_config(llama, tmp_path):
    folder, _, _ = llama
    hf = tmp_path / "hf"
    import shutil

    shutil.copytree(folder, hf)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    tokenizer.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE,
    }))
    (hf / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2, 7]}))
    manifest = ortinf.export(hf, tmp_path / "pkg", progress=False)
    assert manifest.has_tokenizer and manifest.has_chat_template
    assert manifest.eos_token_ids == (2, 7)  # every EOS id of generation_config, not only config.json's
    assert (tmp_path / "pkg" / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    from transformers import AutoTokenizer

    # the package's tokenizer.json alone tokenizes as transformers does with the source folder
    loaded = Tokenizer.from_file(str(tmp_path / "pkg" / "tokenizer.json"))
    hf_tokenizer = AutoTokenizer.from_pretrained(hf)
    for text in ("the lazy fox", "quick  brown dog jumps", "unseen words: zebra!"):
        assert loaded.encode(text).ids == hf_tokenizer(text).input_ids
    assert Manifest.load(tmp_path / "pkg") == manifest  # the manifest round-trips through JSON


def test_a_killed_exports_staging_folder_is_removed_by_the_next(llama, tmp_path):
    """Issue 30's attack, finding 11: killed exports left `.partial-*` folders forever. The next export to
    the same folder removes those whose process is gone, and leaves a live one's alone."""
    import os
    import socket
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    dead = tmp_path / ".pkg.partial-killed"
    live = tmp_path / ".pkg.partial-running"
    for folder, pid in ((dead, gone), (live, str(os.getpid()))):
        folder.mkdir()
        (folder / "model.onnx.data").write_bytes(b"x" * 1024)
        (folder / ".owner").write_text(f"{socket.gethostname()} {pid}\n")
    ortinf.export(llama[0], tmp_path / "pkg", progress=False)
    assert not dead.exists() and live.exists()
    assert not (tmp_path / "pkg" / ".owner").exists()  # the marker never reaches a package
