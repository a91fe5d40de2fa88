"""Anthropic's Messages API (ortinf/serve/api/anthropic/routes.py) in process (the real app and engine, support/app_helpers.py)
and the official `anthropic` SDK over an ASGI transport:
create and stream, stop reasons, a tool round trip, count_tokens, the same tokens as the chat completion the
request means, and Anthropic-shaped errors (x-api-key with --api-key)."""

from __future__ import annotations

import anthropic
import pytest
from support.app_helpers import serving

from ortinf.serve.state import ServerConfig

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
                            "additionalProperties": False}}
ASK = [{"role": "user", "content": "weather in Paris?"}]
GREEDY = {"temperature": 0}  # the 2026 SDK's create() has no temperature argument; the API still reads it


@pytest.fixture(scope="module")
def server(byte_package):
    with serving(ServerConfig(packages=(byte_package,), api_key="sk-test", engine_options={"kv_cache_memory": "64MiB"})) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.anthropic("sk-test")


@pytest.fixture(scope="module")
def model(server):
    return server.http.get("/v1/models", headers={"x-api-key": "sk-test"}).json()["data"][0]["id"]


def test_create_equals_the_chat_completion_it_means(client, server, model):
    """At temperature 0 a message is the chat completion of the same conversation: the same text, the same prompt."""
    message = client.messages.create(model=model, max_tokens=12, system="Be brief.", messages=ASK, extra_body=GREEDY)
    chat = server.openai("sk-test").chat.completions.create(
        model=model, max_tokens=12, temperature=0, messages=[{"role": "system", "content": "Be brief."}, *ASK])
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == chat.choices[0].message.content
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens
    assert message.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]


def test_stream_events_assemble_to_the_message(client, model):
    request = dict(model=model, max_tokens=10, messages=ASK, extra_body=GREEDY)
    whole = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    raw = [event.type for event in client.messages.create(**request, stream=True)]
    assert raw[0] == "message_start" and raw[-2:] == ["message_delta", "message_stop"]
    assert raw[1] == "content_block_start" and raw[-3] == "content_block_stop" and set(raw[2:-3]) == {"content_block_delta"}


def test_stop_sequences_name_the_one_matched(client, model):
    text = client.messages.create(model=model, max_tokens=16, messages=ASK, extra_body=GREEDY).content[0].text
    stop = text[3:6]
    assert len(stop) == 3 and stop.strip()
    message = client.messages.create(model=model, max_tokens=16, messages=ASK, stop_sequences=["\u00ff\u00fe", stop], extra_body=GREEDY)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == text[: text.index(stop)]


def test_a_forced_tool_call_and_its_result_round_trip(client, model):
    message = client.messages.create(model=model, max_tokens=80, messages=ASK, tools=[WEATHER],
                                     tool_choice={"type": "tool", "name": "get_weather"})
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_") and set(call.input) == {"city"}
    history = [*ASK, {"role": "assistant", "content": message.content},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}]}]
    reply = client.messages.create(model=model, max_tokens=8, messages=history, tools=[WEATHER], extra_body=GREEDY)
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # one call (a sampled reply may hold several, which 200 tokens might not finish)
    with client.messages.stream(model=model, max_tokens=200, messages=ASK, tools=[WEATHER],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [block.type for block in final.content] == ["tool_use"]
    assert final.content[0].name == "get_weather" and set(final.content[0].input) == {"city"}


def test_count_tokens_is_the_prompt_of_the_message(client, model):
    counted = client.messages.count_tokens(model=model, messages=ASK, system="Be brief.", tools=[WEATHER])
    message = client.messages.create(model=model, max_tokens=1, messages=ASK, system="Be brief.", tools=[WEATHER])
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens > 10


def test_errors_are_anthropic_shaped(client, server, model):
    with pytest.raises(anthropic.AuthenticationError) as denied:
        server.anthropic("wrong").messages.create(model=model, max_tokens=4, messages=ASK)
    assert denied.value.body["error"]["type"] == "authentication_error"
    assert denied.value.body["error"]["message"] == "invalid x-api-key"  # Anthropic's words
    assert denied.value.response.headers["x-should-retry"] == "false"  # the SDKs (and Claude Code) retry a 401 otherwise
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=model, max_tokens=4, messages=[{"role": "tool", "content": "x"}])
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    assert bad.value.body["error"]["message"] == "messages.0.role: Input should be 'user' or 'assistant'"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="no-such-model", max_tokens=4, messages=ASK)
    response = server.http.post("/v1/messages", headers={"x-api-key": "sk-test"}, json={"model": model, "messages": ASK})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in response.json()["error"]["message"]
    refused = server.http.post("/v1/messages", headers={"x-api-key": "sk-test"},
                         json={"model": model, "max_tokens": 4, "messages": ASK, "mcp_servers": [{"url": "x"}]})
    assert refused.status_code == 400 and "mcp_servers" in refused.json()["error"]["message"]
    ignored = server.http.post("/v1/messages", headers={"x-api-key": "sk-test", "anthropic-version": "2023-06-01"},
                         json={"model": model, "max_tokens": 2, "messages": ASK, "metadata": {"user_id": "u1"}})
    assert ignored.status_code == 200 and ignored.headers["x-ignored-fields"] == "metadata"
    both = server.http.post("/v1/messages", headers={"x-api-key": "sk-test", "authorization": "Bearer sk-test"},
                      json={"model": model, "max_tokens": 2, "messages": ASK})
    assert both.status_code == 401 and "one credential" in both.json()["error"]["message"]


def test_output_config_format_is_enforced(client, model):
    import json

    import jsonschema

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "sunny": {"type": "boolean"}},
              "required": ["city", "sunny"], "additionalProperties": False}
    message = client.messages.create(model=model, max_tokens=80, messages=ASK,
                                     output_config={"format": {"type": "json_schema", "schema": schema}})
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), schema)
