"""Structured output's compiler (ortinf/runtime/sample/structured_output.py): a format that spells one of the model's
special tokens is refused up front in one line (llguidance cannot write one as text: the output failed at that point
with the parser's state dump), and the compiler's own errors are one line."""

from __future__ import annotations

import pytest
from support.tiny_models import add_byte_tokenizer
from tokenizers import Tokenizer

from ortinf.errors import RequestError
from ortinf.runtime.sample.structured_output import GrammarCompiler, StructuredOutput


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    add_byte_tokenizer(folder, 384)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.add_special_tokens(["<|im_end|>"])
    tokenizer.add_tokens(["<think>", "<tool_call>"])  # added but not special, as Qwen3's: llguidance treats them as special too
    return GrammarCompiler(tokenizer, 400, [2])


@pytest.mark.parametrize(("output", "token"), [
    (StructuredOutput("regex", "<think>[a-z]{3}"), "<think>"),
    (StructuredOutput("regex", r"x<\|im_end\|>"), "<|im_end|>"),
    (StructuredOutput.json_schema({"const": "<|im_end|>"}), "<|im_end|>"),
    (StructuredOutput.choice(["a", "<tool_call>{}"]), "<tool_call>"),
])
def test_a_format_that_spells_a_special_token_is_refused_in_one_line(compiler, output, token):
    with pytest.raises(RequestError) as caught:
        compiler.compile(output)
    message = str(caught.value)
    assert f"spells {token!r}, a special token of this model" in message and "\n" not in message


def test_the_compilers_errors_are_one_line(compiler):
    with pytest.raises(RequestError) as caught:
        compiler.compile(StructuredOutput("regex", "ab(c"))
    message = str(caught.value)
    assert "\n" not in message and "unclosed group" in message and message.startswith("invalid regex")
    assert compiler.compile(StructuredOutput("regex", "<thin[a-z]>")) is not None  # near a special token's text is fine


def test_the_compiled_grammar_cache_is_bounded_by_memory(compiler, monkeypatch):
    """The cache is bounded by the compiled grammars' estimated memory, not their count alone: large schemas that
    fit the count push the oldest out once the bytes run over (256 of 1,000 properties held 1.5 GB)."""
    from ortinf.runtime.sample import structured_output as module

    monkeypatch.setattr(module, "CACHE_BYTES", 4 * 2**20)  # about 6 of these schemas (~0.6 MB each, estimated)
    compiler._templates.clear()
    compiler.cached_bytes = 0
    for i in range(12):
        schema = {"type": "object", "properties": {f"k{i}_{j}": {"enum": [f"v{j}_{x}" for x in range(5)]} for j in range(100)}}
        compiler.compile(StructuredOutput.json_schema(schema))
        assert compiler.cached_bytes <= module.CACHE_BYTES
    assert 2 <= len(compiler._templates) < 12  # by count (256) all would stay
    huge = {"type": "object", "properties": {f"h{j}": {"enum": [f"w{j}_{x}" for x in range(5)]} for j in range(2000)}}
    compiler.compile(StructuredOutput.json_schema(huge))  # over a quarter of the budget: compiled, used, not kept
    assert all(key.spec != StructuredOutput.json_schema(huge).spec for key in compiler._templates)
