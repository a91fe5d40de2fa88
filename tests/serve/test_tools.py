"""Tool calling in process (the real app and engine) through the official openai client over an ASGI transport, on a random-weight model with a
Hermes-style (Qwen) tools template."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from ortinf.tasks.chat.tool_parsers import PARSERS, detect
from ortinf.tasks.chat.tools import held_back, resolve_parser

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
                                       "required": ["zone"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
ASK = [{"role": "user", "content": "weather in Paris?"}]


def _check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("parallel", [True, False])
def test_required_gives_valid_calls(client, model, parallel):
    for seed in range(5):
        choice = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", seed=seed,
                                                parallel_tool_calls=parallel, max_tokens=300).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        _check_calls(choice.message.tool_calls)
        if not parallel:
            assert len(choice.message.tool_calls) == 1


def test_named_function_is_called(client, model):
    for seed in range(5):
        choice = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], seed=seed, max_tokens=300,
                                                tool_choice={"type": "function", "function": {"name": "get_time"}}).choices[0]
        assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
        _check_calls(choice.message.tool_calls)


def test_round_trip_through_the_clients_own_types(client, model):
    first = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required", seed=3, max_tokens=300)
    call = first.choices[0].message.tool_calls[0]
    messages = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})}]
    second = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=8, seed=1)
    assert second.choices[0].message.tool_calls is None and isinstance(second.choices[0].message.content, str)
    # the call and its result went through the template: the prompt grew by both
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + len(call.function.arguments) // 4


def test_streamed_tool_call_deltas_assemble_to_the_same_calls(client, model):
    request = dict(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", seed=11, max_tokens=300)
    whole = client.chat.completions.create(**request).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                entry["name"] += delta.function.name or ""
                entry["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [{"name": c.function.name, "arguments": c.function.arguments} for c in whole]


def test_auto_reads_hermes_calls_from_the_text(client, model):
    """The package's template writes <tool_call>, so 'auto' parses Hermes blocks; the output is forced
    to one here (a random model would rarely write it), streamed and not."""
    forced = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    request = dict(model=model, messages=ASK, tools=[WEATHER], max_tokens=300,
                   extra_body={"structured_outputs": {"choice": ["Sure. " + forced]}})
    choice = client.chat.completions.create(**request).choices[0]
    assert choice.message.content == "Sure. " and choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris", "unit": "celsius"}
    content, names = "", []
    for chunk in client.chat.completions.create(**request, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            names += [d.function.name for d in c.delta.tool_calls or []]
    assert content == "Sure. " and names == ["get_weather"]


def test_tool_errors_are_400(client, model):
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="tool_choice needs tools"):
        client.chat.completions.create(model=model, messages=ASK, tool_choice="required")
    # a required call wins over response_format, which shapes text replies (OpenAI accepts both; the Agents SDK sends both)
    both = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=300,
                                          response_format={"type": "json_object"}, seed=2).choices[0]
    assert both.finish_reason == "tool_calls" and both.message.tool_calls[0].function.name == "get_weather"


def test_an_enforced_call_cut_short_stays_text():
    """A stop string or max_tokens can cut the enforced JSON: the reply is then text, never a 500."""
    from ortinf.tasks.chat.tools import plan

    required = plan([WEATHER], "required", True, "hermes")
    for text in ('[{"name": "get_weather", "parameters": {"city"', "5", "[5]", '[{"nam": 1}]', ""):
        assert required.parse(text, "hermes") == (text, [])
    content, calls = required.parse('[{"name": "get_weather", "parameters": {"city": "x", "unit": "celsius"}}]', "hermes")
    assert content is None and [c.name for c in calls] == ["get_weather"]


def _parsed(parser: str, text: str):
    content, calls = PARSERS[parser].parse(text)
    return content, [(name, json.loads(arguments)) for name, arguments in calls]


def test_tool_parsers_by_value():
    assert _parsed("hermes", "plain text") == ("plain text", [])
    text = 'hi <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call><tool_call>{"name": "g"}</tool_call>'
    assert _parsed("hermes", text) == ("hi ", [("f", {"a": 1}), ("g", {})])
    assert _parsed("hermes", "<tool_call>{not json}</tool_call>") == ("<tool_call>{not json}</tool_call>", [])
    assert _parsed("llama3_json", '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}') == (None, [("f", {"a": 1}), ("g", {})])
    assert _parsed("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"a": [1]}}') == (None, [("f", {"a": [1]})])
    assert _parsed("llama3_json", "The answer is {not a call}") == ("The answer is {not a call}", [])
    assert _parsed("mistral", 'Sure.[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]') == ("Sure.", [("f", {"a": 1})])
    assert _parsed("mistral", '[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}') == (None, [("f", {"a": 1}), ("g", {})])
    assert _parsed("granite", '<|tool_call|>[{"name": "f", "arguments": {"a": 1}}]') == (None, [("f", {"a": 1})])
    assert _parsed("granite", '<|tool_call|>[{"name": 3}]') == ('<|tool_call|>[{"name": 3}]', [])


def test_tool_parser_detected_from_the_chat_template():
    assert detect("{% for m in messages %}<tool_call>{{ m }}</tool_call>{% endfor %}") == "hermes"
    assert detect("{{- '<|python_tag|>' + tool_call.name }}") == "llama3_json"
    assert detect("{{ '[TOOL_CALLS]' + tool_calls | tojson }}") == "mistral"
    assert detect("<|start_of_role|>assistant<|end_of_role|><|tool_call|>") == "granite"
    assert detect("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert resolve_parser("auto", None) is None and resolve_parser("mistral", "<tool_call>") == "mistral"
    assert resolve_parser("none", "<tool_call>") is None


def test_held_back_text_by_value():
    assert held_back("abc <tool", "auto", "hermes") == 4  # "<tool" may start a call: held back
    assert held_back("abc <tool_call>{", "auto", "hermes") == 4
    assert held_back("abc <b", "auto", "hermes") == 6
    assert held_back(' {"na', "auto", "llama3_json") == 0  # Llama 3 may start a call with no marker
    assert held_back("ok [TOOL_", "auto", "mistral") == 3
    assert held_back("[{", "required", None) == 0


def test_tools_without_tool_choice_read_the_models_calls(client, model):
    """OpenAI's default with tools is "auto" (LangChain's bind_tools sends no tool_choice): this package's template writes
    <tool_call>, so the hermes parser reads the reply; a reply with no call is plain content, never a 400."""
    reply = client.chat.completions.with_raw_response.create(model=model, messages=ASK, tools=[WEATHER], max_tokens=24, temperature=0)
    assert "x-ortinf-warning" not in reply.headers  # a parser was found
    choice = reply.parse().choices[0]
    assert (choice.message.tool_calls is None) == (choice.finish_reason != "tool_calls")
    assert choice.message.content is not None or choice.message.tool_calls
    # a random model seldom writes a call of its own: vLLM's guided_regex makes it write one, which "auto" then reads
    block = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>'
    for stream in (False, True):
        request = dict(model=model, messages=ASK, tools=[WEATHER], max_tokens=80, extra_body={"guided_regex": re.escape("ok " + block)})
        if stream:
            chunks = list(client.chat.completions.create(**request, stream=True))
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][-1]
        else:
            message = client.chat.completions.create(**request).choices[0]
            content, calls, finish = message.message.content, message.message.tool_calls, message.finish_reason
        assert content == "ok " and finish == "tool_calls"
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris", "unit": "celsius"})]
