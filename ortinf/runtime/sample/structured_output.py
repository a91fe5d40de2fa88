"""Structured output: a grammar (JSON schema, regex, choice, Lark) that every sampled token must follow.

llguidance does the work (no torch): a grammar compiles once per distinct spec into a template
matcher, cached, and each request gets a copy that advances on every accepted token. Before a
step's sampling, the token masks of all constrained rows are filled in parallel by llguidance's
executor, in a worker thread while the graph runs (both release the GIL); the sampler then sets
the disallowed logits to -inf. A matcher that reaches the end of its grammar finishes its request
("stop"); one that can no longer continue fails its request with the matcher's reason.

JSON is generated compactly (no free whitespace between tokens): a weak model given freedom to emit
whitespace can spend its whole token budget on it.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, consume_token_par, fill_next_token_bitmask_par
from tokenizers import Tokenizer

from ortinf import json_text
from ortinf.errors import RequestError
from ortinf.runtime.sample.json_schema import closed as closed_objects

Kind = Literal["json", "regex", "choice", "grammar"]
CACHE_SIZE = 256  # compiled grammars kept (least recently used dropped first)...
CACHE_BYTES = 128 * 2**20  # ...and their estimated memory: by count alone, 256 large schemas held 1.5 GB
# A compiled matcher's memory, estimated from its spec and grammar text: RSS measured per entry (20 JSON schemas each of
# 10, 100 and 1,000 enum properties; llguidance 1.x) was 128 KB, 598 KB and 6.0 MB for 1.8, 16 and 171 KB of text.
BASE_BYTES, BYTES_PER_CHAR = 128 * 2**10, 36
JSON_OPTIONS = {"whitespace_flexible": False}


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """What a request's output must match. `spec` is text so that equal specs share a compiled grammar:
    a JSON schema (keys sorted), a regex, a JSON list of choices, or a Lark grammar."""

    kind: Kind
    spec: str
    param: str = "structured_outputs"  # the request field named in errors

    @classmethod
    def json_schema(cls, schema: dict | str, param: str = "response_format") -> StructuredOutput:
        if isinstance(schema, str):
            try:
                schema = json_text.loads(schema)
            except ValueError as exc:
                raise RequestError(f"the JSON schema is not valid JSON: {exc}", param=param) from exc
        if schema is True:  # the schema `true`: any JSON value
            schema = {}
        if schema is False:
            raise RequestError("the JSON schema `false` allows no output at all", param=param)
        if not isinstance(schema, dict):
            raise RequestError("a JSON schema must be an object", param=param)
        try:  # objects closed unless the schema opens them, as vLLM's default backend does (ortinf/runtime/sample/json_schema.py)
            return cls("json", json_text.dumps(closed_objects(schema), sort_keys=True), param)
        except RecursionError:
            raise RequestError(f"the JSON schema is {json_text.MAX_DEPTH_MESSAGE}", param=param) from None
        except ValueError as exc:
            raise RequestError(f"the JSON schema is {exc}", param=param) from exc

    @classmethod
    def choice(cls, options: Sequence[str], param: str = "structured_outputs") -> StructuredOutput:
        if not options or not all(isinstance(o, str) for o in options):
            raise RequestError("choice must be a non-empty list of strings", param=param)
        if any(option == "" for option in options):
            raise RequestError("choice options must be non-empty strings (an empty one would allow no output at all)", param=param)
        return cls("choice", json.dumps(list(options)), param)

    def grammar(self) -> str:
        """The llguidance grammar text for this spec."""
        if self.kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(self.spec, defaults=JSON_OPTIONS)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.spec)
        if self.kind == "choice":
            return llguidance.grammar_from("choice", self.spec)
        return llguidance.grammar_from("grammar", self.spec)  # Lark, or GBNF converted to Lark


class GrammarCompiler:
    """Compiles specs into matchers for one tokenizer; thread-safe (requests are prepared off the loop)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        self._source = tokenizer
        self._eos = list(eos_token_ids) or None
        self._tokenizer: llguidance.LLTokenizer | None = None  # built on first use (about a second for 100k tokens)
        self._json_tokenizer: llguidance.LLTokenizer | None = None  # the same with llguidance's JSON slices
        self._executor: llguidance.LLExecutor | None = None
        self._templates: OrderedDict[StructuredOutput, tuple[llguidance.LLMatcher, int]] = OrderedDict()  # matcher, est. bytes
        self.cached_bytes = 0
        self._lock = threading.Lock()
        # the texts of the tokenizer's added tokens (<|im_end|>, <think>, <tool_call>): llguidance treats each as a special
        # token that no grammar can write, so a grammar whose text spells one fails at that point of the output
        added = tokenizer.get_added_tokens_decoder().values() if hasattr(tokenizer, "get_added_tokens_decoder") else ()
        self._added = sorted({token.content for token in added if len(token.content) > 1}, key=len, reverse=True)

    def _llg_tokenizer(self, param: str, kind: Kind = "grammar") -> llguidance.LLTokenizer:
        """The tokenizer a kind's matchers use: JSON masks come ~30% cheaper with llguidance's JSON
        "slices" (token groups it can accept or reject at once); other grammars use the general ones."""
        with self._lock:
            if self._tokenizer is None:
                try:
                    self._tokenizer = llguidance.LLTokenizer(llguidance_tokenizer_json(self._source), n_vocab=self.vocab_size, eos_token=self._eos)
                except ValueError as exc:  # a tokenizer whose token bytes llguidance cannot work out
                    raise RequestError(f"structured output is not available for this model's tokenizer: {exc}", param=param) from exc
                self._executor = llguidance.LLExecutor()
                self._json_tokenizer = self._tokenizer.with_slices(llguidance.LLTokenizer.json_slices())
            return self._json_tokenizer if kind == "json" else self._tokenizer

    def compile(self, output: StructuredOutput) -> llguidance.LLMatcher:
        """The cached template matcher for `output`; raises RequestError with the compiler's message."""
        key = StructuredOutput(output.kind, output.spec)
        with self._lock:
            found = self._templates.get(key)
            if found is not None:
                self._templates.move_to_end(key)
                return found[0]
        spelled = self._spelled(output)
        if spelled is not None:  # refused up front, in one line: it would fail mid-output with the parser's state dump
            raise RequestError(f"the {_name(output.kind)} spells {spelled!r}, a special token of this model: structured output "
                               "writes text and cannot write special tokens; leave it out of the format (the model's own "
                               "markers such as <think> or <tool_call> come from its reasoning or tool parser)", param=output.param)
        try:
            grammar = output.grammar()
        except (ValueError, TypeError) as exc:
            raise RequestError(f"invalid {_name(output.kind)}: {one_line(str(exc))}", param=output.param) from exc
        template = llguidance.LLMatcher(self._llg_tokenizer(output.param, output.kind), grammar, log_level=0)
        if template.is_error():
            raise RequestError(f"invalid {_name(output.kind)}: {one_line(template.get_error())}", param=output.param)
        if template.is_stopped():  # nothing may be generated at all (e.g. choice [""])
            raise RequestError(f"the {_name(output.kind)} allows only an empty output", param=output.param)
        cost = BASE_BYTES + BYTES_PER_CHAR * (len(output.spec) + len(grammar))
        if cost > CACHE_BYTES // 4:  # one this large would push out most of the others: used once, not kept
            return template
        with self._lock:
            if key not in self._templates:
                self._templates[key] = (template, cost)
                self.cached_bytes += cost
            while len(self._templates) > CACHE_SIZE or self.cached_bytes > CACHE_BYTES:
                _, (_, dropped) = self._templates.popitem(last=False)
                self.cached_bytes -= dropped
        return template

    def _spelled(self, output: StructuredOutput) -> str | None:
        """The first added token whose text the spec holds literally (a regex's escapes read as the characters)."""
        if not self._added:
            return None
        text = re.sub(r"\\([^A-Za-z0-9])", r"\1", output.spec) if output.kind in ("regex", "grammar") else output.spec
        return next((token for token in self._added if token in text or json.dumps(token)[1:-1] in text), None)

    def matcher(self, output: StructuredOutput) -> llguidance.LLMatcher:
        """A fresh matcher for one request (a copy of the cached template)."""
        return self.compile(output).deep_copy()

    def fill_masks(self, matchers: Sequence[llguidance.LLMatcher]) -> np.ndarray:
        """Bool masks [len(matchers), vocab] of the tokens each matcher allows next (computed in parallel)."""
        bitmask = allocate_token_bitmask(len(matchers), self.vocab_size)
        fill_next_token_bitmask_par(self._executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
        return bits[:, : self.vocab_size].astype(bool)

    def advance(self, pairs: Sequence[tuple[llguidance.LLMatcher, int]]) -> list[tuple[bool, str | None]]:
        """Feeds each matcher its accepted token (in parallel): per pair (grammar complete, error or None)."""
        consumed = consume_token_par(self._executor, list(pairs))
        return [_outcome(matcher, ok, token) for (matcher, token), ok in zip(pairs, consumed)]


# What llguidance reads in place of a bare Metaspace decoder: the same text (the marker becomes a
# space, a leading space is dropped), written as Llama's decoder, which llguidance knows.
METASPACE_AS_SEQUENCE = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}


def llguidance_tokenizer_json(tokenizer: Tokenizer) -> str:
    """The tokenizer as llguidance can read it (a Metaspace decoder rewritten as Llama's sequence)."""
    spec = json.loads(tokenizer.to_str())
    decoder = spec.get("decoder") or {}
    if decoder.get("type") == "Metaspace" and decoder.get("replacement", "\u2581") == "\u2581":
        spec["decoder"] = METASPACE_AS_SEQUENCE
    return json.dumps(spec)


def one_line(message: str, limit: int = 300) -> str:
    """An llguidance message as one line: up to its parser state dump and grammar listing (not the client's), its
    lines joined, cut at `limit` characters."""
    head = re.split(r"\n\s*(?:<state>|<grammar>|\d+ \| )", message, maxsplit=1)[0]
    text = " ".join(head.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _name(kind: Kind) -> str:
    return {"json": "JSON schema", "regex": "regex", "choice": "choice list", "grammar": "grammar"}[kind]


def _outcome(matcher: llguidance.LLMatcher, consumed: bool, token_id: int) -> tuple[bool, str | None]:
    if not consumed or matcher.is_error():
        return False, matcher.get_error() or f"token {token_id} does not follow the grammar"
    return matcher.is_stopped(), None
