"""The clients people point at vLLM, each against a real server this test starts (no network): LangChain
(bind_tools with no tool_choice, with_structured_output, streaming), LiteLLM's hosted_vllm provider,
instructor in its JSON, JSON-schema and tool modes (MD_JSON sends no
format to enforce: the schema is only in the prompt), and the openai Agents SDK's tool loop over the Responses API."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM reads its price list from the network otherwise


class City(BaseModel):
    name: str = Field(max_length=12)
    sunny: bool


def get_weather(city: str) -> str:
    """The weather in a city."""
    return json.dumps({"city": city, "celsius": 21})


# a bounded argument: a random model under the grammar ends the string within max_tokens
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def base_url(byte_server):
    return f"{byte_server.url}/v1"


@pytest.fixture(scope="module")
def model(base_url):
    import openai

    return openai.OpenAI(base_url=base_url, api_key="unused").models.list().data[0].id


def test_langchain_tools_structured_output_and_streaming(base_url, model):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=model, base_url=base_url, api_key="unused", max_tokens=24, temperature=0, max_retries=0)
    reply = llm.bind_tools([WEATHER]).invoke([HumanMessage("weather in Paris?")])  # no tool_choice: "auto"
    assert isinstance(reply.content, str) and isinstance(reply.tool_calls, list)
    forced = ChatOpenAI(model=model, base_url=base_url, api_key="unused", max_tokens=200, temperature=0, max_retries=0)
    called = forced.bind_tools([WEATHER], tool_choice="get_weather").invoke([HumanMessage("weather in Paris?")])
    assert [c["name"] for c in called.tool_calls] == ["get_weather"] and isinstance(called.tool_calls[0]["args"]["city"], str)
    city = forced.with_structured_output(City, method="json_schema", include_raw=True).invoke("a city")
    assert isinstance(city["parsed"], City), city
    # strict: LangChain closes the schema (additionalProperties false), so the grammar ends the call; without it a
    # random model may write extra properties until max_tokens, as the schema allows
    city = forced.with_structured_output(City, method="function_calling", strict=True).invoke("a city")
    assert isinstance(city, City)
    streamed = "".join(chunk.content for chunk in llm.stream("hello"))
    assert streamed == llm.invoke("hello").content


def test_litellm_hosted_vllm(base_url, model):
    import litellm

    reply = litellm.completion(model=f"hosted_vllm/{model}", api_base=base_url, api_key="unused", max_tokens=8, temperature=0,
                               messages=[{"role": "user", "content": "hello"}])
    assert isinstance(reply.choices[0].message.content, str) and reply.usage.completion_tokens > 0
    chunks = litellm.completion(model=f"hosted_vllm/{model}", api_base=base_url, api_key="unused", max_tokens=8, temperature=0,
                                messages=[{"role": "user", "content": "hello"}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reply.choices[0].message.content


class Note(BaseModel):
    """instructor's JSON mode puts the schema in the prompt and asks for any JSON object (response_format json_object):
    a random model's object need not have City's fields, so this model has defaults for all of them."""

    title: str = ""
    done: bool = False


@pytest.mark.parametrize("mode", ["JSON", "JSON_SCHEMA", "TOOLS"])
def test_instructor_modes(base_url, model, mode):
    import instructor
    import openai

    client = instructor.from_openai(openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0), mode=getattr(instructor.Mode, mode))
    wanted = Note if mode == "JSON" else City
    reply = client.chat.completions.create(model=model, response_model=wanted, max_retries=0, max_tokens=200, temperature=0,
                                           messages=[{"role": "user", "content": "a city"}])
    assert isinstance(reply, wanted)


def test_agents_sdk_tool_loop(base_url, model):
    import openai
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    calls = []

    @function_tool
    def weather(city: Annotated[str, Field(max_length=12)]) -> str:
        """The weather in a city."""
        calls.append(city)
        return get_weather(city)

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    # the first turn must call the tool (a random model would not choose to); the SDK then resets tool_choice, and the
    # final answer is a City (text.format json_schema), which the grammar ends within max_tokens
    agent = Agent(name="forecaster", instructions="Answer with the weather.", tools=[weather], output_type=City,
                  model=OpenAIResponsesModel(model=model, openai_client=client),
                  model_settings=ModelSettings(tool_choice="required", max_tokens=120, temperature=0))

    async def run() -> tuple:
        whole = await Runner.run(agent, "weather in Paris?", max_turns=3)
        streamed = Runner.run_streamed(agent, "weather in Rome?", max_turns=3)
        return whole, streamed, [event.type async for event in streamed.stream_events()]

    result, streamed, events = asyncio.run(run())
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"], kinds
    assert isinstance(result.final_output, City) and len(calls) == 2
    assert "raw_response_event" in events and isinstance(streamed.final_output, City)
