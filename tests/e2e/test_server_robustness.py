"""Issue 9's triggers on the real server: each answers with a clear error (or is served) and the
server keeps serving; failures inside a step end only their own requests; an engine that keeps
failing exits non-zero; admission and streams are released on every path."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
from support.server_helpers import running_server
from test_server_errors import assert_error

from ortinf import LLM, SamplingParams

GREEDY = {"prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def reference(chat_package) -> str:
    """The greedy text of GREEDY from the offline engine."""
    llm = LLM(chat_package, provider="cpu", num_blocks=64)
    return llm.generate(GREEDY["prompt"], SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].text


def assert_still_serving(url: str, reference: str) -> None:
    assert httpx.get(f"{url}/health").status_code == 200
    response = httpx.post(f"{url}/v1/completions", json=GREEDY, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == reference


def complete(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_negative_and_huge_seeds_are_mapped_into_range(llama_server, reference):
    url = llama_server.url
    texts = []
    for seed in (-1, 2**64 - 1, -(2**70), 2**200):
        response = complete(url, {"prompt": "def ", "seed": seed, "max_tokens": 6, "temperature": 1.0})
        assert response.status_code == 200, response.text
        texts.append(response.json()["choices"][0]["text"])
    assert texts[0] == texts[1]  # -1 and 2**64 - 1 are the same seed, as in vLLM
    assert_still_serving(url, reference)


def test_stop_token_ids_beyond_the_vocabulary_are_400(llama_server, reference):
    url = llama_server.url
    response = complete(url, {"prompt": "hi", "min_tokens": 1, "stop_token_ids": [999999]})
    assert_error(response, 400, "999999", "[0, 256)", param="stop_token_ids")
    assert_error(complete(url, {"prompt": "hi", "stop_token_ids": [-3]}), 400, param="stop_token_ids.0")
    assert_error(complete(url, {"prompt": [5, 256, 7]}), 400, "256", param="prompt")
    assert_still_serving(url, reference)


def test_tiny_temperature_is_greedy(llama_server, reference):
    for temperature in (1e-39, 1e-6):
        response = complete(llama_server.url, {**GREEDY, "temperature": temperature})
        assert response.status_code == 200 and response.json()["choices"][0]["text"] == reference


def test_field_policy_refuses_ignores_and_maps(llama_server):
    """docs/compatibility.md: a refused field is a 400 saying what to send instead; an ignored one is named
    in X-Ignored-Fields; vLLM's guided_* fields are structured_outputs."""
    url = llama_server.url
    assert_error(complete(url, {"prompt": "x", "best_of": 2}), 400, "best_of", "n samples", param="best_of")
    assert_error(complete(url, {"prompt": "x", "structural_tag": "x"}), 400, "structured_outputs.grammar", param="structural_tag")
    assert_error(complete(url, {"prompt": "x", "suffix": "y"}), 400, "suffix is not supported", param="suffix")
    assert_error(complete(url, {"prompt": "x", "use_beam_search": True, "stop": "y"}), 400, "beam search does not take stop", param="stop")
    sent = complete(url, {"prompt": "x", "max_tokens": 2, "best_of": 1, "use_beam_search": False, "store": False,
                          "service_tier": "auto", "metadata": {"a": "b"}, "length_penalty": None, "some_new_field": 3})
    assert sent.status_code == 200, sent.text
    assert sent.headers["x-ignored-fields"] == "metadata, service_tier, some_new_field, store"
    assert "x-ignored-fields" not in complete(url, {"prompt": "x", "max_tokens": 2}).headers
    choice = complete(url, {"prompt": "x", "max_tokens": 8, "temperature": 0, "guided_choice": ["yes", "no"]}).json()["choices"][0]
    assert choice["text"] in ("yes", "no")
    assert_error(complete(url, {"prompt": "x", "guided_regex": "a", "structured_outputs": {"regex": "b"}}), 400, "not both")
    # this package's template writes no tool-call format: "auto" answers as text and says why
    tools = [{"type": "function", "function": {"name": "f"}}]
    chat = {"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": "auto", "max_tokens": 3}
    reply = httpx.post(f"{url}/v1/chat/completions", json=chat)
    assert reply.status_code == 200 and "--tool-call-parser" in reply.headers["x-ortinf-warning"]
    assert reply.json()["choices"][0]["message"]["tool_calls"] is None
    message = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "1"}]}]}
    assert_error(httpx.post(f"{url}/v1/chat/completions", json=message), 400, "tool_calls")
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]}
    assert_error(httpx.post(f"{url}/v1/chat/completions", json=image), 400, "image_url", "reads text", param="messages")


def test_too_many_prompts_is_400(llama_server):
    assert_error(complete(llama_server.url, {"prompt": ["a"] * 257, "max_tokens": 1}), 400, param="prompt")
    # 200 prompts x n=2 fit the schema but not the server's capacity (64 + 256): 400, not 429
    assert_error(complete(llama_server.url, {"prompt": ["a"] * 200, "n": 2, "max_tokens": 1}), 400, "at most 320", param="n")


def test_stop_string_in_the_length_limited_step_reports_stop(llama_server):
    """The stop string appears in the very token that reaches max_tokens: finish_reason is stop."""
    url = llama_server.url
    for prompt in ("the quick brown fox", "a small cat", "numbers like 12", "paged attention", "the lazy dog"):
        body = {"prompt": prompt, "temperature": 0, "ignore_eos": True}
        before = complete(url, {**body, "max_tokens": 5}).json()["choices"][0]["text"]
        full = complete(url, {**body, "max_tokens": 6}).json()["choices"][0]["text"]
        stop = full[len(before):]
        if stop.strip() and full.find(stop) == len(before):
            choice = complete(url, {**body, "max_tokens": 6, "stop": [stop]}).json()["choices"][0]
            assert choice["finish_reason"] == "stop" and choice["text"] == before
            return
    pytest.fail("no prompt whose 6th token starts a new stop string")


def test_echo_logprobs_identical_on_every_call_and_concurrently(llama_server):
    """lm-eval's loglikelihood shapes: the same 45-token context ten times (the second call used to
    read the prefix cache and return 13 logprobs), then concurrently, as text and as token ids."""
    url = llama_server.url
    ids = [(7 * i + 3) % 250 + 3 for i in range(45)]
    bodies = [{"prompt": ids, "echo": True, "logprobs": k, "max_tokens": m, "temperature": 0} for k in (0, 5) for m in (0, 1)]
    for body in bodies:
        first = complete(url, body).json()["choices"][0]["logprobs"]
        assert len(first["tokens"]) == 45 + body["max_tokens"]
        for _ in range(9):
            assert complete(url, body).json()["choices"][0]["logprobs"] == first

    async def together() -> list[dict]:
        async with httpx.AsyncClient(timeout=60) as client:
            responses = await asyncio.gather(*(client.post(f"{url}/v1/completions", json=bodies[1]) for _ in range(8)))
        return [r.json()["choices"][0]["logprobs"] for r in responses]

    expected = complete(url, bodies[1]).json()["choices"][0]["logprobs"]
    assert all(result == expected for result in asyncio.run(together()))


def test_api_key_is_checked_before_the_body_is_read(chat_package, tmp_path):
    with running_server([str(chat_package), "--api-key", "k", "--max-body-size", "1KiB"], tmp_path) as server:
        big = {"prompt": "x" * 5000}
        assert_error(httpx.post(f"{server.url}/v1/completions", json=big), 401)
        assert_error(httpx.post(f"{server.url}/v1/completions", json=big, headers={"authorization": "Bearer k"}), 413)


def test_admission_is_released_when_clients_vanish(chat_package, tmp_path, reference):
    """Capacity 2: clients that send a streaming request and vanish at once (before or while the body
    starts) must not keep their admission slots, or every later request would get 429."""
    args = [str(chat_package), "--max-num-seqs", "1", "--max-queued-requests", "1"]
    with running_server(args, tmp_path) as server:
        body = json.dumps({"prompt": "the quick", "max_tokens": 50, "stream": True, "ignore_eos": True}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        for _ in range(30):
            with socket.create_connection(("127.0.0.1", server.port)) as sock:
                sock.sendall(head + body)
                sock.shutdown(socket.SHUT_WR)
        for _ in range(100):  # the server notices the disconnects within a few polls
            if complete(server.url, GREEDY).status_code == 200:
                break
            time.sleep(0.1)
        assert_still_serving(server.url, reference)
        statuses = set()
        for _ in range(2):  # both slots are free again: two concurrent requests are admitted
            threads = [threading.Thread(target=lambda: statuses.add(complete(server.url, GREEDY).status_code)) for _ in range(2)]
            [t.start() for t in threads]
            [t.join() for t in threads]
        assert statuses == {200}


def test_a_beam_search_is_admitted_as_its_beams(chat_package, tmp_path, reference):
    """--max-num-seqs 4 and no queue: a search of 8 beams (n=1, best_of=8) is a 400 naming best_of; a search of 4
    beams fills the server (another request meanwhile is a 429) and /metrics counts it as 4 admitted sequences.
    (It took one slot per n before: four n=1, best_of=32 searches ran 128 sequences on a 4-sequence server.)"""
    args = [str(chat_package), "--max-num-seqs", "4", "--max-queued-requests", "0"]
    with running_server(args, tmp_path) as server:
        search = {"prompt": "the quick", "max_tokens": 200, "ignore_eos": True, "use_beam_search": True, "n": 1}  # long enough to watch
        assert_error(complete(server.url, {**search, "best_of": 8}), 400, "8 sequences", "best_of")
        done: list = []
        thread = threading.Thread(target=lambda: done.append(complete(server.url, {**search, "best_of": 4})))
        thread.start()
        admitted = 0.0
        for _ in range(200):
            metrics = httpx.get(f"{server.url}/metrics").text
            line = next(x for x in metrics.splitlines() if x.startswith("ortinf:num_requests_admitted"))
            admitted = float(line.rsplit(" ", 1)[1])
            if admitted or done:
                break
            time.sleep(0.02)
        busy = complete(server.url, GREEDY)
        thread.join()
        assert admitted == 4, admitted
        assert busy.status_code == 429, busy.text
        assert done[0].status_code == 200, done[0].text
        assert_still_serving(server.url, reference)


def test_a_poisoned_request_fails_alone(chat_package, tmp_path, reference):
    """A request that passes validation but fails inside a step (injected: a token id that makes the
    graph call raise) gets a 500 (or an error event when streaming); the requests batched with it in
    the same step finish with the right text, and the server stays healthy."""
    poison = next(t for t in range(200, 256) if t not in LLM(chat_package, provider="cpu", num_blocks=64).engine.tokenize(GREEDY["prompt"])[1])
    good_ids = LLM(chat_package, provider="cpu", num_blocks=64).generate(GREEDY["prompt"], SamplingParams(temperature=0, max_tokens=12))
    if poison in good_ids[0].outputs[0].token_ids:
        pytest.skip("the reference generates the poison token")
    with running_server([str(chat_package)], tmp_path, faults={"token_id": poison}) as server:
        url = server.url

        async def batch() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                good = [client.post(f"{url}/v1/completions", json=GREEDY) for _ in range(3)]
                bad = client.post(f"{url}/v1/completions", json={"prompt": [5, poison, 6], "max_tokens": 4})
                return await asyncio.gather(bad, *good)

        bad, *good = asyncio.run(batch())
        error = assert_error(bad, 500, "engine failed", "other requests are unaffected")
        assert error["code"] == "request_failed"
        assert all(r.status_code == 200 and r.json()["choices"][0]["text"] == reference for r in good)
        stream = httpx.post(f"{url}/v1/completions", json={"prompt": [poison], "max_tokens": 4, "stream": True}, timeout=60)
        events = [line[6:] for line in stream.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "request_failed"
        for _ in range(3):  # single failures are the requests' fault, however many: the engine lives
            assert complete(url, {"prompt": [poison], "max_tokens": 2}).status_code == 500
            assert_still_serving(url, reference)


def test_an_engine_that_keeps_failing_exits_non_zero(chat_package, tmp_path):
    """Every graph call from the third on fails: requests get 500 while the server lives, and after
    three failed steps in a row the process stops with exit status 1 for its supervisor."""
    with running_server([str(chat_package)], tmp_path, faults={"after_steps": 3}) as server:
        first = complete(server.url, {"prompt": "fail", "max_tokens": 20, "ignore_eos": True})
        assert_error(first, 500, "engine failed")
        assert httpx.get(f"{server.url}/health").status_code == 200  # one failure may be the request's
        for _ in range(2):
            try:
                response = complete(server.url, {"prompt": "again", "max_tokens": 2})
                assert response.status_code == 500
            except httpx.TransportError:
                break  # the server may already be stopping
        assert server.process.wait(60) == 1
        assert "engine steps in a row failed" in server.log()


def test_embeddings_beyond_the_context_are_400_unless_truncated(embed_server, minilm_package):
    from ortinf.runtime.worker.encoder_graph import EncoderGraph

    url = f"{embed_server.url}/v1/embeddings"
    long_text = "the quick brown fox jumps over the lazy dog " * 60  # ~540 tokens; the model takes 256
    error = assert_error(httpx.post(url, json={"input": ["short", long_text]}), 400, "at most 256", "truncate_prompt_tokens",
                         param="input")
    assert "tokens" in error["message"]
    truncated = httpx.post(url, json={"input": ["short", long_text], "truncate_prompt_tokens": 256}, timeout=60)
    assert truncated.status_code == 200, truncated.text
    expected = EncoderGraph(minilm_package, provider="cpu").embed(["short", long_text])  # the Python API truncates
    got = [d["embedding"] for d in truncated.json()["data"]]
    assert max(abs(a - b) for row, ref in zip(got, expected) for a, b in zip(row, ref)) < 1e-4
    assert_error(httpx.post(url, json={"input": "x", "truncate_prompt_tokens": 1000}), 400, "1000", "256",
                 param="truncate_prompt_tokens")
    assert_error(httpx.post(url, json={"input": [[101, 999999, 102]]}), 400, "999999", param="input")
    assert_error(httpx.post(url, json={"input": ["x"] * 2049}), 400, param="input")


def test_many_embedding_inputs_run_in_chunks(embed_server, minilm_package):
    """2,048 inputs, one of them long: answered in input order, equal to one-at-a-time embeddings."""
    from ortinf.runtime.worker.encoder_graph import EncoderGraph

    texts = [f"sentence number {i} about {'cats' if i % 2 else 'dogs'}" for i in range(2047)] + ["a long one " * 40]
    response = httpx.post(f"{embed_server.url}/v1/embeddings", json={"input": texts}, timeout=300)
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(len(texts)))
    encoder = EncoderGraph(minilm_package, provider="cpu")
    for index in (0, 1, 1000, 2047):
        expected = encoder.embed([texts[index]])[0]
        assert max(abs(a - b) for a, b in zip(data[index]["embedding"], expected)) < 1e-4
