"""ortinf/json_text.py: untrusted JSON read strictly, numbers beyond a double clamped, and JSON that max_tokens cut
closed into the longest prefix that parses (what a cut tool call's arguments become)."""

from __future__ import annotations

import json

import pytest

from ortinf import json_text


def first_closing(text: str):
    for candidate in json_text.closings(text):
        try:
            return json_text.loads(candidate)
        except ValueError:
            continue
    return None


@pytest.mark.parametrize(("text", "closed"), [
    ('[{"name":"Read","parameters":{"file_path":"/tm', [{"name": "Read", "parameters": {"file_path": "/tm"}}]),
    ('{"city": "Paris", "da', {"city": "Paris"}),  # a key cut in its quotes: the pair goes
    ('{"a": "x\\', {"a": "x"}),  # a lone backslash would escape the closing quote
    ('{"a": tru', {}),  # a literal cut short: back to the last place a value may end
    ('{"a": [1, 2, {"b": "c', {"a": [1, 2, {"b": "c"}]}),
    ('<tool_call>{"name": "f", "arguments": {"q": "w', None),  # the markers around the JSON are kept as text
])
def test_cut_json_is_closed_into_the_longest_prefix_that_parses(text, closed):
    if closed is None:
        candidate = json_text.closings(text)[0]
        assert candidate.startswith("<tool_call>") and json.loads(candidate[len("<tool_call>"):]) == {"name": "f", "arguments": {"q": "w"}}
    else:
        assert first_closing(text) == closed


def test_nothing_open_means_no_candidates_and_the_tries_are_bounded():
    assert json_text.closings('{"a": 1}') == [] and json_text.closings("plain text") == []
    deep = "[" * 5000
    assert len(json_text.closings(deep, tries=32)) == 33 and first_closing(deep) is None  # nested past the limit: no reading


def test_numbers_beyond_a_double_are_clamped_and_constants_refused():
    assert json_text.dumps(json_text.loads('{"a": 1e999, "b": -1e999}')) == '{"a": 1.7976931348623157e+308, "b": -1.7976931348623157e+308}'
    with pytest.raises(ValueError, match="not JSON"):
        json_text.loads('{"a": NaN}')
