"""POST /v1/responses (and GET / DELETE), through the official openai client in process (the real app and engine, over an ASGI transport), on the
byte-level tiny llama with a Hermes-style tools template."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"], "additionalProperties": False}}


def test_text_response_equals_the_chat_completion(client, model):
    response = client.responses.create(model=model, input="hello there", instructions="be brief", max_output_tokens=12, temperature=0)
    chat = client.chat.completions.create(model=model, messages=[{"role": "system", "content": "be brief"},
                                                                  {"role": "user", "content": "hello there"}],
                                          max_tokens=12, temperature=0)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens and response.usage.output_tokens == chat.usage.completion_tokens
    finished = chat.choices[0].finish_reason
    assert response.status == ("incomplete" if finished == "length" else "completed")
    if finished == "length":
        assert response.incomplete_details.reason == "max_output_tokens"
    assert client.responses.retrieve(response.id).output_text == response.output_text  # stored by default


def test_streamed_events_assemble_to_the_response(client, model):
    request = dict(model=model, input=[{"role": "user", "content": [{"type": "input_text", "text": "count to three"}]}],
                   max_output_tokens=10, temperature=0, store=False)
    whole = client.responses.create(**request)
    events = list(client.responses.create(**request, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(events[-1].response.id)  # store=False


def test_function_call_round_trip_and_previous_response_id(client, model):
    first = client.responses.create(model=model, input="weather in Paris?", tools=[WEATHER], tool_choice="required",
                                    max_output_tokens=200, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"celsius": 21})}
    # continued by id: the server holds the conversation; and the same turn sent whole, as the Agents SDK sends it
    by_id = client.responses.create(model=model, previous_response_id=first.id, input=[result], tools=[WEATHER], tool_choice="none",
                                    max_output_tokens=6, temperature=0)
    whole = client.responses.create(model=model, input=[{"role": "user", "content": "weather in Paris?"},
                                                        *[c.model_dump(exclude_none=True) for c in calls], result],
                                    tools=[WEATHER], tool_choice="none", max_output_tokens=6, temperature=0)
    assert by_id.output_text == whole.output_text and by_id.usage.input_tokens == whole.usage.input_tokens
    assert by_id.usage.input_tokens > first.usage.input_tokens + len(calls[0].arguments) // 4
    assert by_id.previous_response_id == first.id
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.create(model=model, previous_response_id=first.id, input="again")


def test_text_format_json_schema_and_policy(byte_app, client, model):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    response = client.responses.create(model=model, input="answer", max_output_tokens=40, temperature=0,
                                       text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(response.output_text), schema)
    url = "/v1/responses"
    hosted = byte_app.http.post(url, json={"input": "x", "max_output_tokens": 2, "tools": [{"type": "web_search"}]})
    assert hosted.status_code == 200 and hosted.headers["x-ignored-fields"] == "tools.0 (web_search)"  # --hosted-tools ignore
    image = byte_app.http.post(url, json={"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]})
    assert image.status_code == 400 and "reads text" in image.json()["error"]["message"]
    bad_name = byte_app.http.post(url, json={"input": "x", "tools": [{"type": "function", "name": "has space"}]})
    assert bad_name.status_code == 400 and bad_name.json()["error"]["param"] == "tools", bad_name.text
    background = byte_app.http.post(url, json={"input": "x", "background": True})
    assert background.status_code == 400 and background.json()["error"]["param"] == "background"
    plain = byte_app.http.post(url, json={"input": "x", "max_output_tokens": 2, "tool_choice": "auto"})  # OpenAI's default, no tools
    assert plain.status_code == 200, plain.text
    ignored = byte_app.http.post(url, json={"input": "x", "max_output_tokens": 2, "reasoning": {"effort": "low"}, "include": [],
                                    "truncation": "auto"})
    assert ignored.status_code == 200 and ignored.headers["x-ignored-fields"] == "include, reasoning, truncation"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_forced_call_cut_by_max_output_tokens_is_an_incomplete_call(client, model, choice):
    """A forced call (required, or a named function) that max_output_tokens cuts: the response is incomplete and its
    item a function_call with status incomplete, streamed or not (it was a completed message holding the partial JSON)."""
    request = dict(model=model, input="weather in Paris?", tools=[WEATHER], tool_choice=choice, max_output_tokens=4, temperature=0)
    for response in (client.responses.create(**request), list(client.responses.create(**request, stream=True))[-1].response):
        assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
        assert [item.type for item in response.output] == ["function_call"], response.output
        call = response.output[0]
        assert call.status == "incomplete"
        if isinstance(choice, dict):
            assert call.name == "get_weather" and call.arguments.startswith("{")
