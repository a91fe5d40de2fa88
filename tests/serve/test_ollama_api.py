"""Ollama's API (ortinf/serve/ollama_api.py) in process (the real app and engine, support/app_helpers.py)
and the official `ollama` Python client over an ASGI transport: chat and
generate, streamed and not, format json, tools, embeddings, tags/show/ps/version, the same tokens as the OpenAI
route at temperature 0, and Ollama-shaped errors."""

from __future__ import annotations

import json

import ollama
import pytest
from support.app_helpers import serving

from ortinf.serve.state import ServerConfig

ASK = [{"role": "user", "content": "weather in Paris?"}]
GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def server(byte_package, minilm_package):
    config = ServerConfig(packages=(byte_package, minilm_package), served_model_names=("tiny", "minilm"),
                          engine_options={"kv_cache_memory": "64MiB"})
    with serving(config) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.ollama()


def test_chat_equals_the_chat_completion(client, server):
    reply = client.chat(model="tiny", messages=ASK, options=GREEDY)
    chat = server.openai("x").chat.completions.create(
        model="tiny", messages=ASK, temperature=0, max_tokens=12)
    assert reply.message.role == "assistant" and reply.message.content == chat.choices[0].message.content
    assert reply.done and reply.done_reason == {"length": "length", "stop": "stop"}[chat.choices[0].finish_reason]
    assert reply.prompt_eval_count == chat.usage.prompt_tokens and reply.eval_count == chat.usage.completion_tokens
    assert reply.total_duration >= reply.eval_duration > 0
    pieces = list(client.chat(model="tiny:latest", messages=ASK, options=GREEDY, stream=True))
    assert all(not p.done for p in pieces[:-1]) and pieces[-1].done and pieces[-1].done_reason == reply.done_reason
    assert "".join(p.message.content for p in pieces) == reply.message.content


def test_generate_streamed_and_raw(client, server):
    whole = client.generate(model="tiny", prompt="weather in Paris?", options=GREEDY)
    chat = client.chat(model="tiny", messages=ASK, options=GREEDY)
    assert whole.response == chat.message.content  # a prompt is one user turn through the template
    assert "".join(p.response for p in client.generate(model="tiny", prompt="weather in Paris?", options=GREEDY, stream=True)) == whole.response
    raw = client.generate(model="tiny", prompt="abc", raw=True, options=GREEDY)
    completion = server.openai("x").completions.create(
        model="tiny", prompt="abc", temperature=0, max_tokens=12)
    assert raw.response == completion.choices[0].text
    loaded = client.generate(model="tiny", prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


def test_format_json_and_a_schema(client):
    reply = client.chat(model="tiny", messages=ASK, format="json", options={"num_predict": 200, "temperature": 0})
    assert reply.message.content.lstrip().startswith("{")  # an open object may run to num_predict; ended, it is whole
    assert reply.done_reason == "length" or isinstance(json.loads(reply.message.content), dict)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    reply = client.generate(model="tiny", prompt="ok?", format=schema, options={"num_predict": 40})
    assert set(json.loads(reply.response)) == {"ok"}


def test_a_tool_call_and_its_result_go_back(client):
    """An assistant turn's tool_calls (Ollama's: no ids, arguments as an object) and a tool turn (tool_name) render
    through the Hermes template: the reply's prompt holds both (more tokens than without them)."""
    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    reply = client.chat(model="tiny", messages=history, tools=[tool], options=GREEDY)
    bare = client.chat(model="tiny", messages=ASK, tools=[tool], options=GREEDY)
    assert reply.done and reply.message.role == "assistant"
    assert reply.prompt_eval_count > bare.prompt_eval_count + len('{"city": "Paris"}sunny')


def test_embed_and_the_older_embeddings(client, server):
    embedded = client.embed(model="minilm", input=["a cat", "a dog"])
    assert len(embedded.embeddings) == 2 and len(embedded.embeddings[0]) == 384 and embedded.prompt_eval_count > 4
    data = server.openai("x").embeddings.create(model="minilm", input=["a cat"]).data
    assert embedded.embeddings[0] == pytest.approx(data[0].embedding, abs=1e-6)
    assert client.embeddings(model="minilm", prompt="a cat").embedding == pytest.approx(data[0].embedding, abs=1e-6)
    assert len(client.embed(model="minilm", input="a cat", dimensions=64).embeddings[0]) == 64


def test_tags_show_ps_and_version(client, server):
    names = {m.model for m in client.list().models}
    assert names == {"tiny", "minilm"}
    shown = client.show("tiny")
    assert "completion" in shown.capabilities and "tools" in shown.capabilities and shown.template
    assert shown.details.format == "onnx" and shown.modelinfo["llama.context_length"] == 1024
    assert client.show("minilm").capabilities == ["embedding"]
    assert {m.model for m in client.ps().models} == names
    assert server.http.get("/api/version").json()["version"]


def test_errors_are_ollama_shaped(client, server):
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="nope", messages=ASK)
    assert missing.value.status_code == 404 and "nope" in missing.value.error
    with pytest.raises(ollama.ResponseError) as pull:
        client.pull("llama3")
    assert pull.value.status_code == 400 and "ortinf export" in pull.value.error
    bad = server.http.post("/api/chat", json={"model": "tiny", "messages": ASK, "options": {"temperature": "hot"}, "stream": False})
    assert bad.status_code == 400 and set(bad.json()) == {"error"}
    ignored = server.http.post("/api/chat", json={"model": "tiny", "messages": ASK, "stream": False, "keep_alive": "5m",
                                                          "options": {"num_ctx": 4096, "num_predict": 2}})
    assert ignored.status_code == 200 and ignored.headers["x-ignored-fields"] == "options.num_ctx"  # keep_alive: --models-dir's
    bad_keep = server.http.post("/api/chat", json={"model": "tiny", "messages": ASK, "stream": False, "keep_alive": "soon"})
    assert bad_keep.status_code == 400 and "keep_alive" in bad_keep.json()["error"]
    for worst in ("nan", "1e999999h"):  # neither reaches the model manager's clock
        answer = server.http.post("/api/chat", json={"model": "tiny", "messages": ASK, "stream": False, "keep_alive": worst})
        assert answer.status_code == 400 and "keep_alive" in answer.json()["error"], answer.text
    with pytest.raises(ollama.ResponseError) as refused:
        client.generate(model="tiny", prompt="x", suffix="y")
    assert "suffix" in refused.value.error
