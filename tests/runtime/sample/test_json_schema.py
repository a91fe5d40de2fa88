"""The objects rule of enforced JSON schemas (ortinf/runtime/sample/json_schema.py), and its effect on the compiled
grammar through llguidance (the real compiler, the byte-level tokenizer)."""

from __future__ import annotations

import copy

import llguidance
import pytest

from ortinf.errors import RequestError
from ortinf.runtime.sample.json_schema import closed
from ortinf.runtime.sample.structured_output import StructuredOutput

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]}


def test_declared_properties_close_the_object_at_every_depth():
    schema = {"type": "object", "properties": {"trip": CITY, "stops": {"type": "array", "items": CITY}},
              "$defs": {"Leg": CITY}, "anyOf": [CITY]}
    original = copy.deepcopy(schema)
    out = closed(schema)
    assert schema == original  # the request's schema is echoed back (Responses' text.format): never changed
    assert out["additionalProperties"] is False
    assert out["properties"]["trip"]["additionalProperties"] is False
    assert out["properties"]["stops"]["items"]["additionalProperties"] is False
    assert out["$defs"]["Leg"]["additionalProperties"] is False and out["anyOf"][0]["additionalProperties"] is False


def test_what_the_schema_says_is_kept():
    assert closed({**CITY, "additionalProperties": True})["additionalProperties"] is True
    extra = {"type": "integer"}
    assert closed({**CITY, "additionalProperties": extra})["additionalProperties"] == extra
    assert "additionalProperties" not in closed({"type": "object"})  # json_object: any object
    assert "additionalProperties" not in closed({**CITY, "unevaluatedProperties": False})
    split = closed({"allOf": [CITY, {"type": "object", "properties": {"note": {"type": "string"}}}]})
    assert all("additionalProperties" not in part for part in split["allOf"])
    assert "additionalProperties" not in closed({"$ref": "#/$defs/A", "properties": {"x": {}}})
    # a property named like a keyword is a property, not a keyword
    named = closed({"type": "object", "properties": {"items": {"type": "string"}, "properties": {"type": "integer"}}})
    assert named["properties"] == {"items": {"type": "string"}, "properties": {"type": "integer"}}


def _accepts(output: StructuredOutput, text: str) -> bool:
    grammar = output.grammar()
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    ok = matcher.consume_tokens(list(text.encode()))
    return bool(ok) and not matcher.is_error() and matcher.is_accepting()


class _Bytes:
    """A 256-token byte tokenizer for llguidance, with token 256 as EOS."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, text) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


def test_the_grammar_ends_the_object_after_its_declared_keys():
    output = StructuredOutput.json_schema(CITY)
    assert _accepts(output, '{"city":"Rome","days":5}')
    assert not _accepts(output, '{"city":"Rome","days":5,"extra":1}')
    opened = StructuredOutput.json_schema({**CITY, "additionalProperties": True})
    assert _accepts(opened, '{"city":"Rome","days":5,"extra":1}')
    assert _accepts(StructuredOutput.json_schema({"type": "object"}), '{"any":1}')


def test_a_schema_nested_past_the_interpreter_is_a_request_error():
    schema: dict = {"type": "object"}
    for _ in range(2000):
        schema = {"type": "object", "properties": {"x": schema}}
    with pytest.raises(RequestError, match="nested too deeply"):
        StructuredOutput.json_schema(schema)
