"""Ollama's API (ortinf/serve/api/ollama/routes.py) in process (the real app and engine, support/app_helpers.py)
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


# -- what Ollama's own tools and the clients users run need (each a defect found against a real `ortinf serve`) -----------


def test_the_version_is_one_codex_accepts(server):
    """Codex's --oss ollama provider wants Ollama >= 0.13.4; 0.12.0 was refused."""
    version = server.http.get("/api/version").json()["version"]
    assert tuple(int(part) for part in version.split(".")) >= (0, 13, 4), version


def test_bodies_are_json_whatever_the_content_type(server):
    """curl -d (Ollama's documentation) sends form-urlencoded, litellm's ollama providers no Content-Type: all were 400s."""
    body = json.dumps({"model": "tiny", "prompt": "hi", "stream": False, "options": GREEDY})
    for headers in ({}, {"content-type": "application/x-www-form-urlencoded"}, {"content-type": "text/plain; charset=utf-8"}):
        answer = server.http.post("/api/generate", content=body, headers=headers)
        assert answer.status_code == 200 and answer.json()["done"], (headers, answer.text)
    chat = server.http.post("/api/chat", content=json.dumps({"model": "tiny", "messages": ASK, "stream": False, "options": GREEDY}),
                            headers={"content-type": "application/x-www-form-urlencoded"})
    assert chat.status_code == 200 and chat.json()["message"]["role"] == "assistant", chat.text
    for broken, said in (("model=tiny&prompt=hi", "JSON object"), ("", "missing request body"), ("[1]", "JSON object"),
                         ("{model", "not valid JSON")):
        answer = server.http.post("/api/generate", content=broken, headers={"content-type": "application/x-www-form-urlencoded"})
        assert answer.status_code == 400 and set(answer.json()) == {"error"} and said in answer.json()["error"], (broken, answer.text)
    assert "ortinf does not pull" in server.http.post("/api/pull", content="").json()["error"]


def test_num_predict_stops_at_the_context_end(client, server):
    """Ollama clips num_predict to what the context leaves (done_reason length there); a 400 broke Open WebUI's title
    task (num_predict 1000) on long chats. A prompt alone past the context stays a 400."""
    prompt = "x" * 1000  # the byte-level tokenizer: about a token a byte, of the context's 1,024
    reply = client.generate(model="tiny", prompt=prompt, raw=True, options={"temperature": 0, "num_predict": 1000})
    assert reply.prompt_eval_count + reply.eval_count <= 1024 and reply.eval_count > 0
    assert reply.done_reason == "length" or reply.prompt_eval_count + reply.eval_count < 1024
    if reply.done_reason == "length":
        assert reply.prompt_eval_count + reply.eval_count == 1024
    chat = client.chat(model="tiny", messages=[{"role": "user", "content": prompt[:900]}], options={"temperature": 0, "num_predict": 5000})
    assert chat.done and chat.prompt_eval_count + chat.eval_count <= 1024
    with pytest.raises(ollama.ResponseError) as overflow:
        client.generate(model="tiny", prompt="x" * 1100, raw=True, options={"num_predict": 4})
    assert overflow.value.status_code == 400 and "context length" in overflow.value.error


def test_raw_out_of_range_options_are_a_400(server):
    """raw: true with temperature 5 was a 500 (a pydantic ValidationError); the templated path said 400."""
    answers = [server.http.post("/api/generate", json={"model": "tiny", "prompt": "hi", "raw": raw, "stream": False,
                                                       "options": {"temperature": 5}}) for raw in (True, False)]
    assert [a.status_code for a in answers] == [400, 400], [a.text for a in answers]
    assert answers[0].json() == answers[1].json() and "temperature" in answers[0].json()["error"]


def test_streams_end_with_an_empty_done_line(client):
    """Ollama's last line (done true) carries no text: the text goes in the lines before it."""
    for pieces, text in ((list(client.chat(model="tiny", messages=ASK, options=GREEDY, stream=True)), lambda p: p.message.content),
                         (list(client.generate(model="tiny", prompt="hi", options=GREEDY, stream=True)), lambda p: p.response)):
        assert pieces[-1].done and text(pieces[-1]) == "" and len(pieces) > 1
        assert all(not p.done for p in pieces[:-1]) and "".join(text(p) for p in pieces)


def test_logprobs_as_ollama_sends_them(client, server):
    """Ollama's logprobs and top_logprobs (a 400 before): the same tokens and logprobs as /v1/chat/completions, whole
    or spread over the streamed lines."""
    reply = client.chat(model="tiny", messages=ASK, options=GREEDY, logprobs=True, top_logprobs=3)
    chat = server.openai("x").chat.completions.create(model="tiny", messages=ASK, temperature=0, max_tokens=12, logprobs=True,
                                                      top_logprobs=3)
    expected = [(entry.token, round(entry.logprob, 4)) for entry in chat.choices[0].logprobs.content]
    assert [(entry.token, round(entry.logprob, 4)) for entry in reply.logprobs] == expected and len(expected) == reply.eval_count
    assert all(len(entry.top_logprobs) == 3 for entry in reply.logprobs)
    raw = server.http.post("/api/chat", json={"model": "tiny", "messages": ASK, "options": GREEDY, "logprobs": True, "stream": False})
    assert [entry["bytes"] for entry in raw.json()["logprobs"]] == [list(entry.bytes) for entry in chat.choices[0].logprobs.content]
    streamed = [entry for piece in client.chat(model="tiny", messages=ASK, options=GREEDY, logprobs=True, stream=True)
                for entry in piece.logprobs or []]
    assert [(entry.token, round(entry.logprob, 4)) for entry in streamed] == expected
    generated = client.generate(model="tiny", prompt="abc", raw=True, options=GREEDY, logprobs=True)
    assert len(generated.logprobs) == generated.eval_count and not generated.logprobs[0].top_logprobs
    assert client.chat(model="tiny", messages=ASK, options=GREEDY).logprobs is None  # asked for nothing
    too_many = server.http.post("/api/chat", json={"model": "tiny", "messages": ASK, "logprobs": True, "top_logprobs": 21})
    assert too_many.status_code == 400 and "top_logprobs" in too_many.json()["error"]


def _prefix_hits(server) -> float:
    from support.server_helpers import metric

    text = server.http.get("/metrics").text
    return metric(text, "ortinf:prefix_cache_hits_total") if "ortinf:prefix_cache_hits_total{" in text else 0.0  # none counted yet


def test_cache_salt_isolates_the_prefix_cache(server):
    """vLLM's cache_salt (top level, or options.cache_salt as the ollama client sends options) was ignored: two salts
    shared cached prompt tokens."""
    ask = [{"role": "user", "content": "the salted prompt, long enough for two blocks of the prefix cache to fill up"}]

    named = []

    def hits(**fields) -> float:
        before = _prefix_hits(server)
        answer = server.http.post("/api/chat", json={"model": "tiny", "messages": ask, "stream": False, "options": {"num_predict": 2},
                                                     **fields})
        assert answer.status_code == 200, answer.text
        named.append(answer.headers.get("x-ignored-fields"))
        return _prefix_hits(server) - before

    assert hits(cache_salt="alice") == 0 and hits(cache_salt="alice") >= 32  # the second hits under its own salt
    assert hits(cache_salt="bob") == 0
    assert hits(options={"cache_salt": "bob", "num_predict": 2}) >= 32  # options.cache_salt is the same salt
    assert hits() == 0 and hits() >= 32  # unsalted prompts share among themselves only
    assert named == [None] * 6  # read, not ignored


KEYED = {"authorization": "Bearer k"}


@pytest.fixture(scope="module")
def keyed(byte_package):
    """A server with --api-key and no tool-call format for its model (--tool-call-parser none)."""
    config = ServerConfig(packages=(byte_package,), served_model_names=("tiny",), api_key="k", tool_call_parser="none",
                          engine_options={"kv_cache_memory": "16MiB"})
    with serving(config) as server:
        yield server


def test_head_is_the_heartbeat_even_behind_a_key(keyed):
    """HEAD / was a 405 (Ollama's Go client's heartbeat, api.Client.Heartbeat); Ollama has no key, so it stays open
    with --api-key, as GET / (the chat page) is."""
    beat = keyed.http.head("/")
    assert beat.status_code == 200 and beat.content == b""
    assert keyed.http.head("/api/version").status_code == 401  # the API itself keeps its key
    assert keyed.http.head("/api/version", headers=KEYED).status_code == 200
    assert keyed.http.head("/api/tags", headers=KEYED).status_code == 200


def test_tools_a_model_cannot_call_are_said_on_chat(keyed):
    """Tools sent to a model without a tool-call format were dropped silently on /api/chat: the OpenAI route's
    X-Ortinf-Warning says so."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    for stream in (False, True):
        answer = keyed.http.post("/api/chat", headers=KEYED, json={"model": "tiny", "messages": ASK, "tools": [tool], "stream": stream,
                                                                   "options": {"num_predict": 2}})
        assert answer.status_code == 200 and "no tool-call format" in answer.headers["x-ortinf-warning"], answer.headers
    plain = keyed.http.post("/api/chat", headers=KEYED, json={"model": "tiny", "messages": ASK, "stream": False,
                                                              "options": {"num_predict": 2}})
    assert "x-ortinf-warning" not in plain.headers


def test_keep_alive_is_checked_where_it_is_read(byte_package, tmp_path):
    """With --models-dir: a keep_alive of 1e18 or "99999999999h" made /api/ps a 500 for every client (no date that far),
    and NaN kept the model loaded forever. Now: Ollama's forms; longer than Go's longest duration is forever (as a
    negative one); NaN and infinity are a 400."""
    import shutil

    shutil.copytree(byte_package, tmp_path / "tiny")
    config = ServerConfig(packages=(), models_dir=str(tmp_path), engine_options={"kv_cache_memory": "16MiB"})
    with serving(config) as server:
        def chat(keep_alive) -> dict:  # any JSON value
            body = json.dumps({"model": "tiny", "messages": ASK, "stream": False, "options": {"num_predict": 1}})
            body = body[:-1] + f', "keep_alive": {keep_alive}}}'  # as sent: NaN and Infinity are not JSON a client library writes
            answer = server.http.post("/api/chat", content=body, headers={"content-type": "application/json"})
            ps = server.http.get("/api/ps")
            assert ps.status_code == 200, ps.text
            return {"status": answer.status_code, "error": answer.json().get("error"), "expires": [m["expires_at"] for m in ps.json()["models"]]}

        for forever in ("1e18", '"99999999999h"', '"-1"', "-5"):
            assert chat(forever) == {"status": 200, "error": None, "expires": ["2318-01-01T00:00:00Z"]}, forever
        assert chat('"1h30m"')["expires"][0] < "2318"
        for broken in ("NaN", "Infinity", "-Infinity", '"nan"', '"inf"', '"soon"'):
            answer = chat(broken)
            assert answer["status"] == 400 and "keep_alive" in answer["error"], (broken, answer)
