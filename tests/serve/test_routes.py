"""The chat and completion routes in process (the app and its engine in this process, through Starlette's
TestClient, no socket): the raw SSE framing, usage arithmetic, n > 1 streams, tool calls and reasoning,
streamed and not. The byte-level tiny llama is steered by guided_regex where a random model would not
write what a test needs (a thought, a tool call)."""

from __future__ import annotations

import json
import re
import time

import pytest
from starlette.testclient import TestClient

from ortinf.serve.app import build_app
from ortinf.serve.state import ServerConfig

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def client(byte_package):
    config = ServerConfig(packages=(byte_package,), reasoning_parser="qwen3", engine_options={"kv_cache_memory": "64MiB"})
    with TestClient(build_app(config)) as client:
        deadline = time.monotonic() + 120
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the model did not load"
            time.sleep(0.05)
        yield client


def events(response) -> list[dict | str]:
    """The SSE body's events, each checked to be one `data: ...` line and a blank line (no other fields)."""
    assert response.status_code == 200, response.text[:300]
    assert response.headers["content-type"].startswith("text/event-stream")
    body = response.text
    assert body.endswith("\n\n") and "\r" not in body
    found = []
    for event in body[:-2].split("\n\n"):
        assert event.startswith("data: ") and "\n" not in event, event[:200]
        data = event[len("data: "):]
        found.append(data if data == "[DONE]" else json.loads(data))
    assert found[-1] == "[DONE]" and "[DONE]" not in found[:-1]
    return found[:-1]


def chat(client, stream: bool = False, **fields):
    body = {"messages": ASK, "max_tokens": 12, **fields, "stream": stream}
    return client.post("/v1/chat/completions", json=body)


def test_sse_framing_n_samples_and_usage(client):
    """n = 3 seeded samples streamed with usage: one id and creation time throughout, each index opened once with
    the role and closed once with a finish reason, usage last with no choices, and the same texts and usage as
    the request not streamed."""
    fields = dict(n=3, seed=7, temperature=1.0, max_tokens=10, ignore_eos=True)
    whole = chat(client, **fields).json()
    chunks = events(chat(client, stream=True, stream_options={"include_usage": True}, **fields))
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    *body, last = chunks
    def counts(usage: dict) -> dict:  # the cached prompt tokens differ: the first request filled the prefix cache
        return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}

    assert last["choices"] == [] and counts(last["usage"]) == counts(whole["usage"]) and all(c.get("usage") is None for c in body)
    texts, opened, finished = {}, [], {}
    for chunk in body:
        (choice,) = chunk["choices"]
        index = choice["index"]
        if choice["delta"].get("role") == "assistant":
            opened.append(index)
        texts[index] = texts.get(index, "") + (choice["delta"].get("content") or "")
        if choice["finish_reason"] is not None:
            assert index not in finished
            finished[index] = choice["finish_reason"]
    assert sorted(opened) == [0, 1, 2] and finished == {0: "length", 1: "length", 2: "length"}
    assert texts == {c["index"]: c["message"]["content"] for c in whole["choices"]}
    usage = whole["usage"]
    assert usage["completion_tokens"] == 3 * 10 and usage["total_tokens"] == usage["prompt_tokens"] + 30


def test_usage_counts_the_tokens_sent(client):
    """completion_tokens is the number of tokens the logprobs list; the prompt's count is the rendered prompt's,
    the same for the same messages whatever is asked of the output; continuous usage grows by the tokens of each chunk."""
    first = chat(client, logprobs=True, temperature=0, max_tokens=6).json()
    second = chat(client, temperature=0, max_tokens=3, ignore_eos=True).json()
    tokens = len(first["choices"][0]["logprobs"]["content"])
    assert first["usage"]["completion_tokens"] == tokens and first["usage"]["prompt_tokens"] == second["usage"]["prompt_tokens"]
    assert second["usage"]["completion_tokens"] == 3
    chunks = events(chat(client, stream=True, temperature=0, max_tokens=5, ignore_eos=True,
                         stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")]
    assert counts == sorted(counts) and counts[-1] == 5


def test_completions_stream_framing_with_n(client):
    fields = {"prompt": "abc", "max_tokens": 6, "n": 2, "seed": 3, "ignore_eos": True}
    whole = client.post("/v1/completions", json=fields).json()
    chunks = events(client.post("/v1/completions", json={**fields, "stream": True}))
    texts = {}
    for chunk in chunks:
        assert chunk["object"] == "text_completion"
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}


def test_a_named_tool_call_streamed_and_not(client):
    """tool_choice naming a function: its call, with arguments valid under the schema, the same streamed (the
    arguments' deltas joined) as not."""
    fields = dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}, seed=1, max_tokens=60)
    message = chat(client, **fields).json()["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    arguments = json.loads(call["function"]["arguments"])
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
    joined, names = "", []
    for chunk in events(chat(client, stream=True, **fields)):
        for delta_call in chunk["choices"][0]["delta"].get("tool_calls") or []:
            names += [delta_call["function"]["name"]] if delta_call["function"].get("name") else []
            joined += delta_call["function"].get("arguments") or ""
    assert names == ["get_weather"] and json.loads(joined) == arguments


def test_reasoning_is_split_streamed_and_not(client):
    """--reasoning-parser qwen3: the thought in reasoning_content, the answer in content, in both framings."""
    forced = {"guided_regex": re.escape("<think>\nweigh it\n</think>\n\nyes"), "max_tokens": 60}
    message = chat(client, **forced).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("weigh it\n", "yes")
    thought = answer = ""
    for chunk in events(chat(client, stream=True, **forced)):
        delta = chunk["choices"][0]["delta"]
        thought += delta.get("reasoning_content") or ""
        answer += delta.get("content") or ""
    assert (thought, answer) == ("weigh it\n", "yes")


def test_an_error_mid_route_is_one_openai_error(client):
    """A value SamplingParams refuses (its one range check) comes back as the OpenAI error object, streamed or not."""
    for stream in (False, True):
        response = chat(client, stream=stream, top_p=0)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "top_p" and "(0, 1]" in error["message"]
