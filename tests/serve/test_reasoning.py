"""--reasoning-parser (ortinf/tasks/chat/reasoning.py): a reasoning model's thinking split from its answer, as vLLM's
`reasoning_content`, streamed or not, before the tool-call parser reads the answer, and as a reasoning item of the
Responses API. The byte-level tiny llama is made to think by vLLM's guided_regex (a random model does not on its own)."""

from __future__ import annotations

import json
import re

import pytest
from support.app_helpers import serving

from ortinf.serve.state import ServerConfig
from ortinf.tasks.chat.reasoning import PARSERS, detect, resolve

THOUGHT = "<think>\nweigh it\n</think>\n\nyes"


def reasoning_server(byte_package, parser: str):
    """The byte llama served in process (support/app_helpers.py) with --reasoning-parser PARSER."""
    return serving(ServerConfig(packages=(byte_package,), reasoning_parser=parser, engine_options={"kv_cache_memory": "64MiB"}))


@pytest.fixture(scope="module")
def client(byte_package):
    with reasoning_server(byte_package, "qwen3") as server:
        yield server.openai()


def _forced(text: str) -> dict:
    return {"guided_regex": re.escape(text)}


def test_parsers_by_value_and_their_partial_splits_only_grow():
    qwen3, r1 = PARSERS["qwen3"], PARSERS["deepseek_r1"]
    assert qwen3.split(THOUGHT) == ("weigh it\n", "yes")
    assert qwen3.split("just an answer") == (None, "just an answer")
    assert qwen3.split("<think>cut short") == ("cut short", None)
    assert r1.split("thinking</think>answer") == ("thinking", "answer") and r1.split("never closed") == ("never closed", None)
    assert r1.split("<think>opened anyway</think>ok") == ("opened anyway", "ok")
    for parser, text in ((qwen3, THOUGHT), (qwen3, "plain"), (r1, "a</think>\\n\\nb"), (r1, "<think>x</think>y")):
        final = parser.split(text)
        for cut in range(len(text) + 1):
            reasoning, content = parser.split(text[:cut], finished=False)
            assert (final[0] or "").startswith(reasoning or "") and (final[1] or "").startswith(content or ""), (text, cut)
    assert qwen3.split("<thi", finished=False) == (None, None) and qwen3.split("<think>a</th", finished=False) == ("a", None)


def test_the_parser_is_detected_from_the_chat_template():
    qwen3 = "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    assert detect(qwen3) == "qwen3" and detect("{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}") == "deepseek_r1"
    assert detect("{{ messages }}") is None and resolve("auto", None) is None and resolve("none", qwen3) is None
    assert resolve("deepseek_r1", None) is PARSERS["deepseek_r1"]


def test_reasoning_content_streamed_and_not(client):
    model = client.models.list().data[0].id
    request = dict(model=model, messages=[{"role": "user", "content": "well?"}], max_tokens=60, extra_body=_forced(THOUGHT))
    message = client.chat.completions.create(**request).choices[0].message
    assert message.model_extra["reasoning_content"] == "weigh it\n" and message.content == "yes"
    chunks = [c for c in client.chat.completions.create(**request, stream=True) if c.choices]
    thought = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)
    answer = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert (thought, answer) == ("weigh it\n", "yes")
    assert "<think>" not in answer and "</think>" not in thought


def test_tool_calls_are_read_after_the_reasoning(client):
    model = client.models.list().data[0].id
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
    text = '<think>need data</think><tool_call>{"name": "lookup", "arguments": {"q": "x"}}</tool_call>'
    choice = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "find x"}], tools=[tool], max_tokens=80,
                                            extra_body=_forced(text)).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.model_extra["reasoning_content"] == "need data"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [("lookup", {"q": "x"})]


def test_responses_reasoning_item(client):
    model = client.models.list().data[0].id
    request = dict(model=model, input="well?", max_output_tokens=60, extra_body=_forced(THOUGHT))
    response = client.responses.create(**request)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == "weigh it\n" and response.output_text == "yes"
    events = list(client.responses.create(**request, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "weigh it\n"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "yes"
    done = events[-1].response
    assert done.output_text == "yes" and [item.type for item in done.output] == ["reasoning", "message"]
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    assert added == [0, 1]


HARMONY = "<|channel|>analysis<|message|>weigh it<|end|><|start|>assistant<|channel|>final<|message|>yes<|return|>"


def test_harmony_parser_by_value_and_partial_splits_only_grow():
    harmony = PARSERS["gpt_oss"]
    assert harmony.split(HARMONY) == ("weigh it", "yes")
    assert harmony.split("<|channel|>final<|message|>just this") == (None, "just this")
    assert harmony.split("<|channel|>analysis<|message|>cut short") == ("cut short", None)
    assert harmony.split("no header at all") == (None, "no header at all")
    final = harmony.split(HARMONY)
    for cut in range(len(HARMONY) + 1):
        reasoning, content = harmony.split(HARMONY[:cut], finished=False)
        assert (final[0] or "").startswith(reasoning or "") and (final[1] or "").startswith(content or ""), cut
    assert detect("{{ '<|start|>assistant<|channel|>final<|message|>' }}") == "gpt_oss"


def test_harmony_channels_through_the_server(byte_package):
    """The tiny model spells harmony's markers byte by byte (guided_regex): the analysis channel comes back as
    reasoning_content, the final channel as the content, streamed or not."""
    with reasoning_server(byte_package, "gpt_oss") as server:
        client = server.openai()
        model = client.models.list().data[0].id
        request = dict(model=model, messages=[{"role": "user", "content": "well?"}], max_tokens=120, extra_body=_forced(HARMONY))
        message = client.chat.completions.create(**request).choices[0].message
        assert (message.model_extra["reasoning_content"], message.content) == ("weigh it", "yes")
        chunks = [c for c in client.chat.completions.create(**request, stream=True) if c.choices]
        thought = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)
        assert (thought, "".join(c.choices[0].delta.content or "" for c in chunks)) == ("weigh it", "yes")
