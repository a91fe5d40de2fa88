"""The compatibility policy (ortinf/serve/field_policy.py) covers every field of every request model,
and docs/compatibility.md is that table."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortinf.serve import field_policy
from ortinf.serve.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from ortinf.serve.api.ollama.protocol import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest, ModelRequest
from ortinf.serve.api.openai.responses import ResponsesRequest
from ortinf.serve.field_policy import IGNORED, IMPLEMENTED, MAPPED, REFUSED, policy
from ortinf.serve.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

MODELS = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest, "/v1/embeddings": EmbeddingRequest,
          "/v1/responses": ResponsesRequest, "/v1/messages": MessagesRequest, "/v1/messages/count_tokens": CountTokensRequest,
          "/api/chat": ChatRequest, "/api/generate": GenerateRequest, "/api/embed": EmbedRequest, "/api/embeddings": EmbeddingsRequest,
          "/api/show": ModelRequest}


@pytest.mark.parametrize("route", sorted(MODELS))
def test_every_field_of_a_request_model_has_a_row(route):
    rules = policy()[route]
    fields = {info.alias or name for name, info in MODELS[route].model_fields.items()}
    missing = sorted(fields - set(rules))
    assert not missing, f"{route}: fields without a policy row: {missing}"
    # a row marked implemented is a field the model reads; the others are fields it does not declare
    wrongly = sorted(name for name, rule in rules.items() if (rule.kind == IMPLEMENTED) != (name in fields))
    assert not wrongly, f"{route}: rows whose kind disagrees with the request model: {wrongly}"
    assert {rule.kind for rule in rules.values()} <= {IMPLEMENTED, MAPPED, IGNORED, REFUSED}


def test_the_docs_hold_the_policy_table():
    doc = (Path(__file__).parents[2] / "docs" / "compatibility.md").read_text()
    assert field_policy.table() in doc, "docs/compatibility.md is stale: paste ortinf.serve.field_policy.table() into it"


def test_the_fields_real_clients_send_are_never_unnamed():
    """What the issue's clients send (openai, the Agents SDK, LangChain, LiteLLM, instructor, vLLM clients)."""
    chat = policy()["/v1/chat/completions"]
    for name in ("store", "metadata", "service_tier", "modalities", "prediction", "reasoning_effort", "best_of", "use_beam_search",
                 "priority", "add_special_tokens", "request_id", "cache_salt", "guided_json", "guided_choice", "guided_regex",
                 "guided_grammar", "parallel_tool_calls", "stream_options"):
        assert name in chat, name
    assert policy()["/v1/embeddings"]["dimensions"].kind == IMPLEMENTED


def test_the_ignored_fields_header_is_printable_ascii():
    """Field names are the client's: schemathesis sent non-ASCII and surrogate names, which a header cannot carry."""
    header = field_policy.ignored_headers(["store", "*\u00eb[", "a\x01b", "\udb7f\udcbcx"])[field_policy.IGNORED_HEADER]
    assert header == "*\\xeb[, a\\x01b, store, \\udb7f\\udcbcx"
    assert len(field_policy.ignored_headers(["z" * 5000])[field_policy.IGNORED_HEADER]) == 1000
    assert header.isascii() and header.isprintable()
    assert field_policy.ignored_headers([]) == {}


def test_too_many_unknown_fields_are_one_400_before_any_is_read():
    """150,000 unknown fields (the outside attack's request): refused by their count, at once, never sorted or escaped
    for the log and the header on the event loop; up to the limit they are named as ignored, as before."""
    import time

    from ortinf.serve.errors import APIError

    flood = CompletionRequest.model_validate({"model": "m", "prompt": "x", **{f"field{i}": i for i in range(150_000)}})
    start = time.perf_counter()
    with pytest.raises(APIError) as caught:
        field_policy.apply("/v1/completions", flood)
    assert time.perf_counter() - start < 0.05
    assert caught.value.status == 400 and "150,000 fields this route does not define" in caught.value.message
    some = CompletionRequest.model_validate({"model": "m", "prompt": "x", **{f"field{i}": i for i in range(field_policy.MAX_UNKNOWN_FIELDS)}})
    assert len(field_policy.apply("/v1/completions", some)) == field_policy.MAX_UNKNOWN_FIELDS
