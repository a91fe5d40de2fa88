"""Structured output in process (the real app and engine) through the official openai client over an ASGI transport, on a random-weight model:
whatever the model would say, the output follows the requested schema, regex, choice or grammar."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
LEAVES = st.one_of(
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span}, st.integers(-1000, 1000), st.integers(0, 5000)),
    st.builds(lambda lo, span: {"type": "number", "minimum": lo, "maximum": lo + span}, st.integers(-50, 50), st.integers(1, 100)),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 12)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(st.one_of(NAMES, st.integers(-9, 99), st.booleans()), min_size=1, max_size=4, unique=True).map(lambda v: {"enum": v}),
)


def _object(children):
    return st.dictionaries(NAMES, children, min_size=1, max_size=4).flatmap(
        lambda props: st.builds(
            lambda required: {"type": "object", "properties": props, "required": sorted(required), "additionalProperties": False},
            st.sets(st.sampled_from(sorted(props)))))


SCHEMAS = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        _object(children),
        st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, children, st.integers(0, 3)),
    ),
    max_leaves=8,
).filter(lambda schema: schema.get("type") in ("object", "array"))


@settings(max_examples=50, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, seed=st.integers(0, 2**31))
def test_random_schemas_are_followed_streaming_or_not(client, schema, seed):
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    request = dict(model=client.models.list().data[0].id, messages=[{"role": "user", "content": "answer in JSON"}],
                   response_format=response_format, temperature=1.0, seed=seed, max_tokens=400)
    reply = client.chat.completions.create(**request)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", (schema, choice.message.content)
    jsonschema.validate(json.loads(choice.message.content), schema)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(**request, stream=True)
                       if chunk.choices)
    assert streamed == choice.message.content


def test_json_object_regex_choice_and_grammar_on_completions(client):
    model = client.models.list().data[0].id
    for seed in range(4):
        text = client.completions.create(model=model, prompt="x", max_tokens=200, seed=seed,
                                         extra_body={"response_format": {"type": "json_object"}}).choices[0].text
        assert isinstance(json.loads(text), dict)
        pattern = r"[a-z]{2,6}-[0-9]{3}"
        choice = client.completions.create(model=model, prompt="x", max_tokens=30, seed=seed,
                                           extra_body={"structured_outputs": {"regex": pattern}}).choices[0]
        assert re.fullmatch(pattern, choice.text) and choice.finish_reason == "stop"
        options = ["red", "green", "blue violet"]
        text = client.completions.create(model=model, prompt="x", max_tokens=30, seed=seed,
                                         extra_body={"structured_outputs": {"choice": options}}).choices[0].text
        assert text in options
        lark = 'start: "(" NUM ("+" NUM)* ")"\nNUM: /[0-9]{1,3}/'
        text = client.completions.create(model=model, prompt="x", max_tokens=60, seed=seed,
                                         extra_body={"structured_outputs": {"grammar": lark}}).choices[0].text
        assert re.fullmatch(r"\([0-9]{1,3}(\+[0-9]{1,3})*\)", text), text


def test_greedy_json_hits_the_length_limit_as_length(client):
    """A grammar does not end a reply early: max_tokens still cuts it, with finish_reason length."""
    choice = client.completions.create(model=client.models.list().data[0].id, prompt="x", max_tokens=3, temperature=0,
                                       extra_body={"structured_outputs": {"json": {"type": "array", "items": {"type": "string"}}}}).choices[0]
    assert choice.finish_reason == "length" and choice.text.startswith("[")


def test_bad_formats_are_400_with_the_compilers_message(client):
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError, match="invalid JSON schema: .*nonsense") as err:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                       response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    assert err.value.body["param"] == "response_format.json_schema"
    with pytest.raises(openai.BadRequestError, match="invalid regex"):
        client.completions.create(model=model, prompt="x", extra_body={"structured_outputs": {"regex": "[a-z"}})
    with pytest.raises(openai.BadRequestError, match="exactly one of"):
        client.completions.create(model=model, prompt="x", extra_body={"structured_outputs": {"regex": "a", "choice": ["a"]}})
    with pytest.raises(openai.BadRequestError, match="guided_json, guided_regex"):
        client.completions.create(model=model, prompt="x", extra_body={"guided_json": {"type": "object"}, "guided_regex": "a"})
    # vLLM's older guided_json is structured_outputs.json, with its compiler's errors
    with pytest.raises(openai.BadRequestError, match="invalid JSON schema"):
        client.completions.create(model=model, prompt="x", extra_body={"guided_json": {"type": "nonsense"}})
    # the server is unharmed and the cache serves the valid spec again
    text = client.completions.create(model=model, prompt="x", max_tokens=30, extra_body={"structured_outputs": {"choice": ["ok"]}}).choices[0].text
    assert text == "ok"
