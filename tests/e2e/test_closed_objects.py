"""Forced tool calls and structured replies end after their declared keys (issue 41, finding 5): with
an unspecified additionalProperties the grammar let a weak model go on with key after key until
max_tokens, so `tool_choice` required or named came back as `tool_calls: []` with the cut JSON in
content, LangChain's bind_tools(tool_choice=...) returned [] and with_structured_output(method=
"function_calling") None. The real server on the byte-level tiny llama, the official openai client and
LangChain; sampled at temperature 1 under 4 seeds with the comma pushed up by logit_bias, so that
wherever the grammar allows another key, the model starts one."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

SEEDS = (0, 1, 2, 3)
# bounded values: a random model under the grammar ends each one within max_tokens; no additionalProperties
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["city", "days"]}
TRIP = {"type": "function", "function": {"name": "plan_trip", "description": "Plan a trip.", "parameters": PARAMETERS}}


class City(BaseModel):
    name: str = Field(max_length=12)
    sunny: bool


@pytest.fixture(scope="module")
def comma_bias(byte_server) -> dict[str, int]:
    ids = httpx.post(f"{byte_server.url}/tokenize", json={"prompt": ",", "add_special_tokens": False}, timeout=30).json()["tokens"]
    assert len(ids) == 1
    return {str(ids[0]): 30}


def sampled(seed: int, comma_bias: dict[str, int]) -> dict:
    return {"temperature": 1.0, "seed": seed, "logit_bias": comma_bias, "max_tokens": 120}


@pytest.mark.parametrize("seed", SEEDS)
def test_forced_calls_close_their_arguments(byte_client, byte_model, comma_bias, seed):
    messages = [{"role": "user", "content": "plan a trip"}]
    for choice in ("required", {"type": "function", "function": {"name": "plan_trip"}}):
        # one call: with parallel calls the comma would (rightly) start call after call in the array
        reply = byte_client.chat.completions.create(model=byte_model, messages=messages, tools=[TRIP], tool_choice=choice,
                                                    parallel_tool_calls=False, **sampled(seed, comma_bias))
        message = reply.choices[0].message
        assert message.tool_calls, (choice, message.content)
        call = message.tool_calls[0].function
        assert call.name == "plan_trip"
        jsonschema.validate(json.loads(call.arguments), {**PARAMETERS, "additionalProperties": False})


@pytest.mark.parametrize("seed", SEEDS)
def test_json_schema_replies_close_their_objects(byte_client, byte_model, comma_bias, seed):
    messages = [{"role": "user", "content": "a trip"}]
    reply = byte_client.chat.completions.create(
        model=byte_model, messages=messages, response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": PARAMETERS}},
        **sampled(seed, comma_bias))
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    jsonschema.validate(json.loads(reply.choices[0].message.content), {**PARAMETERS, "additionalProperties": False})
    response = byte_client.responses.create(model=byte_model, input="a trip", temperature=1.0, max_output_tokens=120,
                                            text={"format": {"type": "json_schema", "name": "trip", "schema": PARAMETERS}},
                                            extra_body={"seed": seed, "logit_bias": comma_bias})
    assert response.status == "completed", response.output_text
    jsonschema.validate(json.loads(response.output_text), {**PARAMETERS, "additionalProperties": False})
    opened = {**PARAMETERS, "required": ["city", "days", "extra"], "properties": {**PARAMETERS["properties"], "extra": {"enum": [1]}}}
    open_reply = byte_client.chat.completions.create(  # additionalProperties: true keeps the object open
        model=byte_model, messages=messages, max_tokens=60, temperature=1.0, seed=seed, logit_bias=comma_bias,
        response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": {**opened, "additionalProperties": True}}})
    assert open_reply.choices[0].finish_reason == "length"  # the comma starts one more key each time, as the schema allows


@pytest.mark.parametrize("seed", SEEDS)
def test_langchain_forced_tools_and_function_calling_structured_output(byte_server, byte_model, comma_bias, seed):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=byte_model, base_url=f"{byte_server.url}/v1", api_key="unused", max_tokens=120, temperature=1.0,
                     seed=seed, logit_bias={int(k): v for k, v in comma_bias.items()}, max_retries=0)
    called = llm.bind_tools([TRIP], tool_choice="plan_trip").invoke([HumanMessage("plan a trip")])
    assert [c["name"] for c in called.tool_calls] == ["plan_trip"], called
    assert set(called.tool_calls[0]["args"]) == {"city", "days"}
    city = llm.with_structured_output(City, method="function_calling").invoke("a city")
    assert isinstance(city, City), city
