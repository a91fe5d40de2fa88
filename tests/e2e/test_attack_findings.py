"""What an outside attack found on the landed server (issue 21), each fixed and kept fixed: deep JSON
nesting was a 500 that also reset the keep-alive connection, $defs under tool_choice "required" were
refused, speculative decoding kept tokens past a stop string, and the drain deadline cut requests
off without an OpenAI-shaped answer, and pipelined requests on a closed connection logged errors."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import pytest
from support.server_helpers import running_server
from tokenizers import Tokenizer

from ortinf.bundled import DEMO_LLAMA

pytestmark = pytest.mark.skipif(not (DEMO_LLAMA / "config.json").is_file(), reason="no committed demo checkpoint")
DEEP = 1200  # deeper than Python's recursion limit allows json.loads to go


@pytest.fixture(scope="module")
def demo(demo_cache, tmp_path_factory):
    with running_server([str(DEMO_LLAMA), "--served-model-name", "demo"], tmp_path_factory.mktemp("logs"),
                        env={"ORTINF_CACHE": str(demo_cache)}, timeout=300) as server:
        yield server


def test_deep_json_is_a_400_and_the_connection_survives(demo):
    with httpx.Client(base_url=demo.url, timeout=60) as client:  # one keep-alive connection for every request
        schema = client.post("/v1/completions", json={"model": "demo", "prompt": "hi", "structured_outputs": {"json": "[" * DEEP}})
        assert schema.status_code == 400 and "nested too deeply" in schema.json()["error"]["message"]
        arguments = "[" * DEEP
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
        chat = client.post("/v1/chat/completions", json={"model": "demo", "messages": messages, "max_tokens": 2})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
        tokenize = client.post("/tokenize", json={"model": "demo", "messages": messages})
        assert tokenize.status_code == 400
        after = client.post("/v1/completions", json={"model": "demo", "prompt": "def f():", "max_tokens": 2})
        assert after.status_code == 200  # the same connection, still open


def test_deeply_nested_tool_parameters_under_required_are_a_400(demo):
    """Issue 30's attack, finding 5: parameters nested 479+ levels under tool_choice "required" were a
    500 RecursionError (the schema's rewrite into the combined schema recursed)."""
    parameters: dict = {"type": "object"}
    for _ in range(450):  # 900 JSON levels: under the client's own encoder's limit, over the rewrite's
        parameters = {"type": "object", "properties": {"x": parameters}}
    tool = {"type": "function", "function": {"name": "deep", "parameters": parameters}}
    with httpx.Client(base_url=demo.url, timeout=60) as client:
        deep = client.post("/v1/chat/completions", json={"model": "demo", "messages": [{"role": "user", "content": "x"}],
                                                         "tools": [tool], "tool_choice": "required", "max_tokens": 2})
        assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]["message"], deep.text
        assert deep.json()["error"]["param"] == "tools"
        after = client.post("/v1/completions", json={"model": "demo", "prompt": "def f():", "max_tokens": 2})
        assert after.status_code == 200


def test_the_models_own_deep_output_under_a_forced_tool_call_is_not_a_500(demo):
    bracket = Tokenizer.from_file(str(DEMO_LLAMA / "tokenizer.json")).token_to_id("[")
    assert bracket is not None
    tool = {"type": "function", "function": {"name": "nest", "parameters": {"type": "array", "items": {"$ref": "#"}}}}
    body = {"model": "demo", "messages": [{"role": "user", "content": "nest"}], "tools": [tool],
            "tool_choice": {"type": "function", "function": {"name": "nest"}}, "logit_bias": {str(bracket): 100}, "max_tokens": 1000}
    plain = httpx.post(f"{demo.url}/v1/chat/completions", json=body, timeout=120)
    assert plain.status_code == 200, plain.text
    message = plain.json()["choices"][0]["message"]
    assert message["content"] is not None or message["tool_calls"]  # cut JSON stays text; a complete call is a call
    with httpx.stream("POST", f"{demo.url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as stream:
        lines = [line for line in stream.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)


def test_local_refs_in_tool_parameters_under_required(demo):
    location = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
    tool = {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"where": {"$ref": "#/$defs/Loc"}}, "required": ["where"], "$defs": {"Loc": location}}}}
    response = httpx.post(f"{demo.url}/v1/chat/completions", timeout=120, json={
        "model": "demo", "messages": [{"role": "user", "content": "weather?"}], "tools": [tool], "tool_choice": "required",
        "max_tokens": 60, "temperature": 0})
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    if message["tool_calls"]:  # 60 tokens may cut the call short: then it is text
        call = message["tool_calls"][0]["function"]
        assert call["name"] == "weather" and isinstance(json.loads(call["arguments"])["where"]["city"], str)


def test_speculative_steps_stop_exactly_at_a_stop_string(demo_cache, monkeypatch):
    """A stop string inside a step that accepted several draft tokens: the tokens after it go, with
    their logprobs, exactly as without speculation."""
    from ortinf import LLM, SamplingParams

    monkeypatch.setenv("ORTINF_CACHE", str(demo_cache))  # the run's demo package (not ~/.cache)

    prompt = "for i in range(10):\n    print(i)\n" * 12
    params = SamplingParams(temperature=0, max_tokens=40, stop=["print"], logprobs=1)
    plain = LLM(DEMO_LLAMA).generate([prompt], params)[0].outputs[0]
    spec = LLM(DEMO_LLAMA, speculative_config={"method": "ngram", "num_speculative_tokens": 4}).generate([prompt], params)[0].outputs[0]
    assert plain.finish_reason == spec.finish_reason == "stop" and plain.stop_reason == spec.stop_reason == "print"
    assert spec.text == plain.text and spec.token_ids == plain.token_ids
    assert len(spec.logprobs) == len(spec.token_ids) == len(plain.logprobs)


def test_the_drain_deadline_answers_every_client(demo_cache, tmp_path):
    """SIGTERM with --shutdown-timeout 1 while requests run longer: the non-streamed one gets an
    OpenAI-shaped 503, the stream an error event and [DONE], and the server exits 0."""
    with running_server([str(DEMO_LLAMA), "--served-model-name", "demo", "--shutdown-timeout", "1"], tmp_path,
                        env={"ORTINF_CACHE": str(demo_cache)}, timeout=300) as server:
        long = {"model": "demo", "prompt": "import os\n", "max_tokens": 1000, "ignore_eos": True}
        answers: dict = {}

        def plain() -> None:
            answers["plain"] = httpx.post(f"{server.url}/v1/completions", json=long, timeout=60)

        worker = threading.Thread(target=plain)
        worker.start()
        events = []
        with httpx.stream("POST", f"{server.url}/v1/completions", json={**long, "stream": True}, timeout=60) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                events.append(line)
                if len(events) == 3:
                    server.process.send_signal(signal.SIGTERM)
        worker.join(60)
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][5:])["error"]
        assert error["code"] == "server_shutting_down" and "--shutdown-timeout" in error["message"]
        response = answers["plain"]
        assert response.status_code == 503 and response.headers["content-type"] == "application/json"
        assert response.json()["error"]["code"] == "server_shutting_down"
        assert server.process.wait(30) == 0


def test_the_drain_deadline_answers_beam_searches(demo_cache, tmp_path):
    """SIGTERM during two beam searches (8 beams each) with --shutdown-timeout 1: the non-streamed one gets a 503, the
    stream an error event and [DONE] (both were uvicorn's text/plain 500 and a cut stream: a search between two steps
    had no request open when the drain deadline ended the open ones, and went on to its next step)."""
    with running_server([str(DEMO_LLAMA), "--served-model-name", "demo", "--shutdown-timeout", "1"], tmp_path,
                        env={"ORTINF_CACHE": str(demo_cache)}, timeout=300) as server:
        search = {"model": "demo", "prompt": "import os\n", "max_tokens": 1000, "ignore_eos": True, "use_beam_search": True,
                  "best_of": 8, "n": 2}
        answers: dict = {}

        def plain() -> None:
            answers["plain"] = httpx.post(f"{server.url}/v1/completions", json=search, timeout=60)

        def streamed() -> None:
            with httpx.stream("POST", f"{server.url}/v1/completions", json={**search, "stream": True}, timeout=60) as stream:
                answers["events"] = [line for line in stream.iter_lines() if line.startswith("data:")]

        workers = [threading.Thread(target=plain), threading.Thread(target=streamed)]
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 60
        while "running" not in answers and time.monotonic() < deadline:  # both searches stepping
            metrics = httpx.get(f"{server.url}/metrics").text
            if labelled(metrics, "ortinf:num_requests_running", "demo") >= 8:
                answers["running"] = True
            time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.join(60)
        assert server.process.wait(30) == 0
    response = answers["plain"]
    assert response.status_code == 503 and response.json()["error"]["code"] == "server_shutting_down", response.text
    events = answers["events"]
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][5:])["error"]["code"] == "server_shutting_down", events[-3:]


def labelled(text: str, name: str, model: str) -> float:
    """A metric's value for one model_name label (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and f'model_name="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_of_two_generation_models_are_their_own(decoder_package, tmp_path):
    """Two decoders in one server: each model's prefix-cache, preemption and token counters count its
    own requests, and no counter is ever decremented (that raised in every step before)."""
    _, llama = decoder_package("llama")
    _, qwen = decoder_package("qwen2")
    with running_server([str(llama), str(qwen), "--served-model-name", "a", "--served-model-name", "b",
                         "--kv-cache-memory", "16MiB"], tmp_path) as server:
        prompt = list(range(3, 60))  # 57 tokens: three full blocks the second request finds cached
        for _ in range(2):
            done = httpx.post(f"{server.url}/v1/completions", json={"model": "b", "prompt": prompt, "max_tokens": 3, "ignore_eos": True})
            assert done.status_code == 200
        done = httpx.post(f"{server.url}/v1/completions", json={"model": "a", "prompt": [5, 6, 7], "max_tokens": 5, "ignore_eos": True})
        assert done.status_code == 200
        text = httpx.get(f"{server.url}/metrics").text
        log = server.log()
    assert labelled(text, "ortinf:generation_tokens_total", "a") == 5 and labelled(text, "ortinf:generation_tokens_total", "b") == 6
    assert labelled(text, "ortinf:prefix_cache_hits_total", "b") >= 48 and labelled(text, "ortinf:prefix_cache_hits_total", "a") == 0
    assert labelled(text, "ortinf:prefix_cache_queries_total", "a") >= 3
    assert "Counters can only be incremented" not in log and "Traceback" not in log


def test_a_huge_prompt_is_refused_before_it_is_tokenized(demo):
    response = httpx.post(f"{demo.url}/v1/completions", json={"model": "demo", "prompt": "x" * 1_500_000, "max_tokens": 1}, timeout=60)
    assert response.status_code == 400
    assert "characters, more than 1024 tokens (the context length) can hold" in response.json()["error"]["message"]


def test_integers_are_integers_405_says_allow_and_the_schema_lists_the_real_errors(demo):
    for body in ({"model": "demo", "prompt": "x", "n": "2"}, {"model": "demo", "prompt": [[False]]}, {"model": "demo", "prompt": [True, 1]}):
        assert httpx.post(f"{demo.url}/v1/completions", json=body).status_code == 400, body
    wrong_method = httpx.get(f"{demo.url}/v1/completions")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"
    schema = httpx.get(f"{demo.url}/openapi.json").json()
    completions = schema["paths"]["/v1/completions"]["post"]["responses"]
    assert "422" not in completions and {"400", "404", "413", "429", "500", "503"} <= set(completions)
    assert completions["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert "404" in schema["paths"]["/v1/models/{model_id}"]["get"]["responses"]


def test_pipelined_requests_on_a_closed_connection_log_no_error(demo):
    """Requests pipelined on one connection that the client closes at once: their answers cannot be
    written, which is nobody's error (uvicorn's httptools protocol did not mark the queued ones as
    disconnected; writing them raised and was logged as an unexpected error)."""
    def raw(path: str, body: dict) -> bytes:
        data = json.dumps(body).encode()
        return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data)

    before = demo.log_path.read_text(errors="replace")
    for path, body in [("/tokenize", {"model": "demo", "prompt": "hi"}), ("/v1/completions", {"model": "demo", "prompt": "hi", "max_tokens": 8}),
                       ("/v1/completions", {"model": "demo", "prompt": "hi", "max_tokens": 8, "stream": True})]:
        for delay in (0, 0.005, 0.05):
            with socket.create_connection(("127.0.0.1", demo.port)) as sock:
                sock.sendall(raw(path, body) * 4)
                time.sleep(delay)
    time.sleep(1.0)
    assert httpx.get(f"{demo.url}/health").status_code == 200
    added = demo.log_path.read_text(errors="replace")[len(before):]
    assert "ERROR" not in added and "Traceback" not in added, added[-3000:]


def test_slowloris_connections_are_closed_at_the_header_deadline(demo_cache, tmp_path):
    """200 connections that each send a request line and then trickle a header every 0.5 s: with
    --request-header-timeout 1 the server closes every one within a few seconds (all were open after 30 s,
    1,100 of them), while a real request is answered meanwhile."""
    import socket

    with running_server([str(DEMO_LLAMA), "--served-model-name", "demo", "--request-header-timeout", "1"], tmp_path,
                        env={"ORTINF_CACHE": str(demo_cache)}, timeout=300) as server:
        sockets = []
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            sockets.append(sock)
        closed: set[int] = set()
        start = time.monotonic()
        while len(closed) < len(sockets) and time.monotonic() - start < 10:
            for index, sock in enumerate(sockets):
                if index in closed:
                    continue
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                    sock.settimeout(0.001)
                    if sock.recv(1024) == b"":
                        closed.add(index)
                except (BlockingIOError, TimeoutError, socket.timeout):
                    pass
                except OSError:  # reset or broken pipe: closed by the server
                    closed.add(index)
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
            time.sleep(0.5)
        took = time.monotonic() - start
        for sock in sockets:
            sock.close()
    assert len(closed) == len(sockets) and took < 6, (len(closed), took)
