"""The JSON schemas a grammar is built from: objects closed unless the schema opens them.

JSON Schema's default is `additionalProperties: true`: after the declared keys an object may go on
with any others. A grammar that follows the default lets a weak model write `{"city":"Rome","days":5,`
and then key after key until max_tokens, so a forced tool call comes back cut, as text, and clients
(LangChain's bind_tools with tool_choice, with_structured_output(method="function_calling")) get
nothing. vLLM's default backend (xgrammar, strict mode) treats an unspecified additionalProperties as
false; so does ortinf, for every JSON schema it enforces (response_format, text.format, tool
parameters, structured_outputs.json):

- an object schema that declares `properties` and says nothing of `additionalProperties` (nor
  `unevaluatedProperties`) gets `additionalProperties: false`; one that says `true` (or gives a
  schema) keeps what it says;
- an object schema without `properties` (`{"type": "object"}`, json_object) stays open: closing it
  would allow only `{}`;
- a schema with `allOf` or a `$ref` beside its keys, and the branches of `allOf`, are left as they
  are (their keys are spread over several schemas; closing one part would forbid the others' keys);
  nothing under `not`, `if`, `propertyNames` is touched (closing there changes what is allowed
  elsewhere).
"""

from __future__ import annotations

_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_LISTS = ("anyOf", "oneOf", "prefixItems")  # lists of schemas
_ONE = ("items", "additionalProperties", "additionalItems", "unevaluatedItems", "contains", "then", "else")  # a schema


def closed(schema: object, close_here: bool = True) -> object:
    """A copy of `schema` with its object schemas closed (the rules above); the input is not changed.
    Raises RecursionError on nesting past the interpreter's limit (the caller's 400)."""
    if isinstance(schema, list):  # "items": [...] (draft 4's tuple form)
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema  # true / false, or a value where a schema was expected: the compiler says what is wrong
    out = dict(schema)
    for key in _MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    for key in _LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed(sub) for sub in out[key]]
    for key in _ONE:
        if key in out:
            out[key] = closed(out[key])
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed(sub, close_here=False) for sub in out["allOf"]]
    spread = "allOf" in out or "$ref" in out
    if close_here and not spread and isinstance(out.get("properties"), dict) \
            and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out
