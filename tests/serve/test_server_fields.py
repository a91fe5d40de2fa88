"""vLLM's and OpenAI's extra fields and endpoints, each checked by value on the real app and engine in process
(their meanings as vLLM documents them)."""

from __future__ import annotations

import json

import openai
import pytest


def _tokenize(server, **body) -> dict:
    response = server.http.post("/tokenize", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _one_token(server, text: str) -> int:
    ids = _tokenize(server, prompt=text, add_special_tokens=False)["tokens"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_tokenize_and_detokenize_round_trip(byte_app):
    body = _tokenize(byte_app, prompt='{"name": "fox"}', return_token_strs=True)
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"]) and body["max_model_len"] == 1024
    text = byte_app.http.post("/detokenize", json={"tokens": body["tokens"]}).json()["prompt"]
    assert text == '{"name": "fox"}'
    bad = byte_app.http.post("/detokenize", json={"tokens": [10**6]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_tokenize_chat_matches_the_chat_prompt(byte_app, client, model):
    messages = [{"role": "user", "content": "hello there"}]
    counted = _tokenize(byte_app, messages=messages)["count"]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=1)
    assert reply.usage.prompt_tokens == counted
    greeted = _tokenize(byte_app, messages=messages, chat_template_kwargs={"greeting": "hi all"})
    assert greeted["count"] > counted  # the template's own variable, set by chat_template_kwargs
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=1,
                                           extra_body={"chat_template_kwargs": {"greeting": "hi all", "messages": []}})
    assert reply.usage.prompt_tokens == greeted["count"]  # kwargs cannot replace the conversation


def test_continue_final_message(byte_app):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello wor"}]
    body = _tokenize(byte_app, messages=messages, add_generation_prompt=False, continue_final_message=True)
    text = byte_app.http.post("/detokenize", json={"tokens": body["tokens"]}).json()["prompt"]
    assert text.endswith("assistant: Hello wor")
    both = byte_app.http.post("/tokenize", json={"messages": messages, "continue_final_message": True})
    assert both.status_code == 400 and "add_generation_prompt" in both.json()["error"]["message"]


def test_retrieve_model(client, model):
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_logit_bias_and_allowed_token_ids(byte_app, client, model):
    x = _one_token(byte_app, "x")
    text = client.completions.create(model=model, prompt="a", max_tokens=6, temperature=0, logit_bias={str(x): 100}).choices[0].text
    assert text == "x" * 6
    y = _one_token(byte_app, "y")
    text = client.completions.create(model=model, prompt="a", max_tokens=12, temperature=1.0, seed=3,
                                     extra_body={"allowed_token_ids": [x, y]}).choices[0].text
    assert set(text) <= {"x", "y"} and len(text) == 12
    with pytest.raises(openai.BadRequestError, match="out of range"):
        client.completions.create(model=model, prompt="a", extra_body={"allowed_token_ids": [10**6]})


def test_bad_words_ban_their_last_token(client, model):
    plain = client.completions.create(model=model, prompt="the fox", max_tokens=8, temperature=0, logprobs=0).choices[0]
    word = next(t for t in plain.logprobs.tokens if t.isascii() and t.strip())
    banned = client.completions.create(model=model, prompt="the fox", max_tokens=8, temperature=0, logprobs=0,
                                       extra_body={"bad_words": [word]}).choices[0]
    assert word not in banned.logprobs.tokens and banned.text != plain.text


def test_stop_string_in_output_and_special_tokens(byte_app, client, model):
    plain = client.completions.create(model=model, prompt="the fox", max_tokens=12, temperature=0).choices[0].text
    stop = plain[3:5]
    cut = client.completions.create(model=model, prompt="the fox", max_tokens=12, temperature=0, stop=[stop]).choices[0]
    kept = client.completions.create(model=model, prompt="the fox", max_tokens=12, temperature=0, stop=[stop],
                                     extra_body={"include_stop_str_in_output": True}).choices[0]
    assert kept.text == cut.text + stop and kept.stop_reason == stop
    bos = {"1": 100}  # <s>, a special token
    hidden = client.completions.create(model=model, prompt="a", max_tokens=3, temperature=0, logit_bias=bos).choices[0].text
    shown = client.completions.create(model=model, prompt="a", max_tokens=3, temperature=0, logit_bias=bos,
                                      extra_body={"skip_special_tokens": False}).choices[0].text
    assert hidden == "" and shown == "<s>" * 3


def test_prompt_logprobs_truncation_cached_tokens_and_fingerprint(byte_app, client, model):
    prompt = "the quick brown fox jumps over the lazy dog " * 4
    ids = _tokenize(byte_app, prompt=prompt)["tokens"]
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body={"prompt_logprobs": 2})
    entries = reply.choices[0].model_extra["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    assert all(str(token) in entry and len(entry) <= 3 for token, entry in zip(ids[1:], entries[1:]))
    assert reply.system_fingerprint.startswith("ortinf-") and "-cpu-fp32" in reply.system_fingerprint
    again = client.completions.create(model=model, prompt=prompt, max_tokens=1)
    assert again.usage.prompt_tokens_details.cached_tokens >= 16  # a whole block or more came from the prefix cache
    short = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body={"truncate_prompt_tokens": 5})
    assert short.usage.prompt_tokens == 5


def test_cache_salt_request_id_add_special_tokens_and_priority(byte_app, client, model):
    """vLLM's request fields, by value."""
    prompt = "salted prefixes are private: " * 4
    first = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body={"cache_salt": "tenant-a"})
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    same = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body={"cache_salt": "tenant-a"})
    assert same.usage.prompt_tokens_details.cached_tokens >= 16
    other = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body={"cache_salt": "tenant-b"})
    unsalted = client.completions.create(model=model, prompt=prompt, max_tokens=1)
    assert other.usage.prompt_tokens_details.cached_tokens == 0 == unsalted.usage.prompt_tokens_details.cached_tokens
    named = client.completions.create(model=model, prompt="x", max_tokens=1, extra_body={"request_id": "job-17"})
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], max_tokens=1,
                                          extra_body={"request_id": "job-17"})
    assert named.id == "cmpl-job-17" and chat.id == "chatcmpl-job-17"  # the same id twice: the engine's ids stay distinct
    # add_special_tokens reaches the tokenizer (this byte tokenizer adds none: tests/runtime/engine/test_engine_features.py
    # checks the BOS one adds); the field is accepted on both routes
    assert client.completions.create(model=model, prompt="x", max_tokens=1, extra_body={"add_special_tokens": False}).choices
    assert client.completions.create(model=model, prompt="x", max_tokens=1, extra_body={"priority": 0}).choices
    with pytest.raises(openai.BadRequestError, match="--scheduling-policy priority"):
        client.completions.create(model=model, prompt="x", max_tokens=1, extra_body={"priority": 3})


def test_continuous_usage_stats(client, model):
    chunks = list(client.completions.create(model=model, prompt="a", max_tokens=5, temperature=0, stream=True,
                                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    with_text = [c for c in chunks if c.choices]
    assert with_text and all(c.usage is not None for c in with_text)
    counts = [c.usage.completion_tokens for c in with_text]
    assert counts == sorted(counts) and chunks[-1].usage.completion_tokens == 5


def test_openapi_schema_describes_responses(byte_app):
    schema = byte_app.http.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    for name in ("Completion", "ChatCompletion", "EmbeddingList", "ModelList", "TokenizeResponse", "Usage", "ToolCallOut"):
        assert name in components, name
    for path, model in (("/v1/completions", "Completion"), ("/v1/chat/completions", "ChatCompletion"), ("/tokenize", "TokenizeResponse")):
        ok = schema["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": f"#/components/schemas/{model}"}
    assert "cached_tokens" in components["PromptTokensDetails"]["properties"]


def test_worst_values_of_the_new_fields_are_400s(byte_app, client, model):
    """Values that once reached int() or llguidance unchecked: each is a 400 naming the field, and the
    server goes on serving."""
    def error(path: str, body: dict) -> dict:
        response = byte_app.http.post(path, json=body)
        assert response.status_code == 400, (body, response.text)
        return response.json()["error"]

    assert error("/v1/completions", {"prompt": "x", "logit_bias": {"²": 1}})["param"] == "logit_bias"  # int("²") raises
    assert error("/v1/completions", {"prompt": "x", "logit_bias": {"9" * 5000: 1}})["param"] == "logit_bias"  # beyond int()'s digits
    assert error("/v1/completions", {"prompt": "x", "logit_bias": {str(i): 1 for i in range(1025)}})["param"] == "logit_bias"
    schema_false = {"type": "json_schema", "json_schema": {"name": "x", "schema": False}}
    assert "allows no output" in error("/v1/completions", {"prompt": "x", "response_format": schema_false})["message"]
    assert "exactly one of prompt and messages" in error("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]})["message"]
    assert error("/tokenize", {"prompt": "x", "tools": []})["param"] == "tools"
    assert error("/tokenize", {"messages": [{"role": "user", "content": "x"}], "add_special_tokens": True})["param"] == "add_special_tokens"
    schema_true = {"type": "json_schema", "json_schema": {"name": "x", "schema": True}}  # `true`: any JSON value
    text = client.completions.create(model=model, prompt="x", max_tokens=60, seed=1, extra_body={"response_format": schema_true}).choices[0].text
    json.loads(text)
