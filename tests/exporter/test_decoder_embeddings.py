"""Decoders as embedding models (issue 32, item 4): a Llama/Qwen2/Qwen3 base model with sentence-transformers'
last-token pooling and normalisation exports as one encoder graph (`--task feature-extraction`, or by itself when
saved without its LM head), and its vectors equal sentence-transformers' own; served, `dimensions` shortens them."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from support.server_helpers import running_server
from support.tiny_models import add_byte_tokenizer, build_decoder

import ortinf

TEXTS = ["the quick brown fox", "a", "paged attention keeps keys and values in fixed blocks", '{"name": "fox"}']


def sentence_transformer(model_type: str, folder):
    from sentence_transformers import SentenceTransformer, models

    build_decoder(model_type, folder / "hf", vocab_size=384, max_position_embeddings=256)
    add_byte_tokenizer(folder / "hf", 384)
    word = models.Transformer(str(folder / "hf"))
    pooling = models.Pooling(word.get_embedding_dimension(), pooling_mode="lasttoken")
    model = SentenceTransformer(modules=[word, pooling, models.Normalize()], device="cpu")
    model.save(str(folder / "st"))
    model.tokenizer.pad_token = "</s>"  # sentence-transformers pads batches (the byte tokenizer names no pad token)
    return model


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_decoder_embeddings_equal_sentence_transformers(model_type, tmp_path):
    model = sentence_transformer(model_type, tmp_path)
    manifest = ortinf.export(tmp_path / "st", tmp_path / "pkg", progress=False)  # saved as the base model: feature-extraction
    assert manifest.task == "feature-extraction" and manifest.encoder.pooling == "lasttoken" and manifest.encoder.normalize
    got = np.asarray(ortinf.LLM(tmp_path / "pkg").embed(TEXTS))
    np.testing.assert_allclose(got, model.encode(TEXTS), atol=1e-4)


def test_a_served_decoder_embedding_model_takes_dimensions_and_base64(tmp_path):
    model = sentence_transformer("qwen2", tmp_path)
    ortinf.export(tmp_path / "st", tmp_path / "pkg", task="feature-extraction", progress=False)
    expected = model.encode(TEXTS)
    with running_server([str(tmp_path / "pkg"), "--served-model-name", "qwen-embed"], tmp_path) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        full = client.embeddings.create(model="qwen-embed", input=TEXTS)  # the client asks for base64
        np.testing.assert_allclose([d.embedding for d in full.data], expected, atol=1e-4)
        short = client.embeddings.create(model="qwen-embed", input=TEXTS, dimensions=16, encoding_format="float")
        cut = expected[:, :16] / np.linalg.norm(expected[:, :16], axis=1, keepdims=True)
        np.testing.assert_allclose([d.embedding for d in short.data], cut, atol=1e-4)
