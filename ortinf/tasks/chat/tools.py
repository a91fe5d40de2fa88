"""Tool calling on chat completions: what the model is asked for, and reading its calls back.

tool_choice "none" shows the tools to the template but reads no calls; "auto" offers them through the chat template and parses the
model's text with the package's tool-call parser (ortinf/tasks/chat/tool_parsers.py: detected from the
chat template, or `--tool-call-parser`; a model with none answers "auto" as plain text and says so in
an X-Ortinf-Warning header); "required" and a named function
are enforced with structured output (a JSON grammar), as vLLM does, so even a weak model emits a
valid call: "required" generates `[{"name": ..., "parameters": {...}}, ...]` (one call unless
parallel_tool_calls), a named function generates its arguments object.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from ortinf import json_text
from ortinf.errors import RequestError
from ortinf.runtime.sample.structured_output import StructuredOutput
from ortinf.tasks.chat import tool_parsers

NO_PARSER = ("tool_choice auto: ortinf found no tool-call format it can read in this model's chat template, so the reply is "
             "plain text; serve it with --tool-call-parser NAME (" + ", ".join(tool_parsers.PARSERS) + ") or send "
             "tool_choice required or a named function")


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = ""

    def to_openai(self, index: int | None = None) -> dict:
        body = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return body if index is None else {"index": index, **body}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def resolve_parser(configured: str, template_source: str | None) -> str | None:
    """The parser for a package: the configured one, or for 'auto' the one its chat template speaks
    (ortinf/tasks/chat/tool_parsers.py detect: Hermes/Qwen, Llama 3 JSON, Mistral, Granite); None: none."""
    if configured == "none":
        return None
    if configured != "auto":
        return configured
    return tool_parsers.detect(template_source)


_PARTIAL_NAME = re.compile(r'"name"\s*:\s*"([^"\\]*)')  # the start of the first call's name in `required`'s grammar output


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """How one request uses tools: what the template sees, what the output must match, how to read it."""

    tools: list[dict] | None  # passed to the chat template (None: the template sees no tools)
    mode: str  # "none", "auto", "required" or "named"
    named: str | None = None
    structured_output: StructuredOutput | None = None
    warning: str | None = None  # why "auto" answers as plain text (no parser for this model): a response header

    def parse(self, text: str, parser: str | None, cut: bool = False) -> tuple[str | None, list[ToolCall]]:
        """(content, tool calls) of a finished output. `cut`: max_tokens ended it; a call it ended inside is still a call,
        with the arguments produced so far closed into JSON (json_text.closings) and finish_reason "length" saying so,
        not the call's half-written text as content; only an output no call can be read from stays text (a name
        still open between several tools, arguments nested past json_text's depth limit)."""
        content, calls = self._parse(text, parser)
        if calls or not cut or self.mode == "none":
            return content, calls
        names = {tool["function"]["name"] for tool in self.tools or ()}
        for candidate in json_text.closings(text):
            closed_content, closed = self._parse(candidate, parser)
            closed = [call for call in closed if call.name in names]
            if closed:
                return closed_content, closed
        if self.mode == "required":  # cut before its name was written: the one tool the grammar still allowed, if one
            started = _PARTIAL_NAME.search(text)
            allowed = [name for name in names if name.startswith(started.group(1) if started else "")]
            if len(allowed) == 1:
                return None, [ToolCall(allowed[0], "{}", new_call_id())]
        return content, calls  # no call can be read (several names still open; arguments nested past json_text's limit): text

    def _parse(self, text: str, parser: str | None) -> tuple[str | None, list[ToolCall]]:
        if self.mode == "named":
            return (None, [ToolCall(self.named or "", text, new_call_id())]) if _is_json(text) else (text, [])
        if self.mode == "required":
            try:  # the grammar's shape, unless a stop string or max_tokens cut it: then it stays text
                calls = [ToolCall(c["name"], json_text.dumps(c.get("parameters", {}), ensure_ascii=False), new_call_id())
                         for c in json_text.loads(text)]
            except (ValueError, TypeError, KeyError, AttributeError):
                return text, []
            return None, calls
        if self.mode == "auto" and parser is not None:
            content, calls = tool_parsers.PARSERS[parser].parse(text)
            return content, [ToolCall(name, arguments, new_call_id()) for name, arguments in calls]
        return text, []


def plan(tools: list[dict] | None, tool_choice, parallel: bool, parser: str | None) -> ToolPlan:
    """The ToolPlan for a request's tools and tool_choice (OpenAI's defaults: auto with tools, none without)."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise RequestError("tool_choice needs tools", param="tool_choice")
        return ToolPlan(None, "none")
    functions = {t["function"]["name"]: t["function"] for t in tools}
    choice = tool_choice if tool_choice is not None else "auto"
    if choice == "none":  # the template still sees the tools (vLLM's default); the output is text
        return ToolPlan(tools, "none")
    if choice == "auto":
        if parser is None:  # the model sees the tools; its reply is read as text (never a 400: clients send auto by default)
            return ToolPlan(tools, "none", warning=NO_PARSER)
        return ToolPlan(tools, "auto")
    if choice == "required":
        defs: dict = {}
        try:  # _hoisted walks each schema recursively: nesting near the interpreter's limit is the client's error
            options = [{"type": "object", "properties": {"name": {"const": name}, "parameters": _hoisted(f, f"tool{i}", defs)},
                        "required": ["name", "parameters"], "additionalProperties": False}
                       for i, (name, f) in enumerate(functions.items())]
        except RecursionError:
            raise RequestError(f"a function's parameters schema is {json_text.MAX_DEPTH_MESSAGE}: flatten it or use $defs",
                               param="tools") from None
        schema = {"type": "array", "items": {"anyOf": options}, "minItems": 1, "$defs": defs}
        if not parallel:
            schema["maxItems"] = 1
        return ToolPlan(tools, "required", structured_output=StructuredOutput.json_schema(schema, param="tools"))
    name = choice["function"]["name"]
    if name not in functions:
        raise RequestError(f"tool_choice names '{name}', which is not among the tools", param="tool_choice")
    schema = _parameters(functions[name])
    return ToolPlan(tools, "named", name, StructuredOutput.json_schema(schema, param="tools"))


def _parameters(function: dict) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}


def _hoisted(function: dict, key: str, defs: dict) -> dict:
    """A reference to the function's parameters schema moved into the root's `defs` as `key`, with its
    own `$defs` / `definitions` beside it (as `key.Name`) and every local `$ref` rewritten to match.

    Under tool_choice "required" each tool's schema sits inside one combined schema, so its local
    references (`#/$defs/Loc`, what pydantic emits; `#` for a recursive schema) would otherwise
    point into the combined root, where they do not exist."""
    params = dict(_parameters(function))
    moved: dict[str, str] = {}  # "#/$defs/Loc" -> "#/$defs/tool0.Loc"
    subs: dict[str, object] = {}
    for section in ("$defs", "definitions"):
        for name, schema in (params.pop(section, None) or {}).items():
            moved[f"#/{section}/{name}"] = f"#/$defs/{key}.{name}"
            subs[f"{key}.{name}"] = schema

    def target(ref: str) -> str:
        if ref == "#":
            return f"#/$defs/{key}"
        for old, new in moved.items():
            if ref == old or ref.startswith(old + "/"):
                return new + ref[len(old):]
        return f"#/$defs/{key}{ref[1:]}" if ref.startswith("#/") else ref

    def rewrite(node: object) -> object:
        if isinstance(node, dict):
            return {k: (target(v) if k == "$ref" and isinstance(v, str) else rewrite(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        return node

    defs[key] = rewrite(params)
    defs.update({name: rewrite(schema) for name, schema in subs.items()})
    return {"$ref": f"#/$defs/{key}"}


def held_back(text: str, mode: str, parser: str | None) -> int:
    """How much of a streamed output's text may be sent as content now: with "auto", the text before
    a tool call (or before what may be the start of one); nothing for enforced calls."""
    if mode in ("required", "named"):
        return 0
    if mode != "auto" or parser is None:
        return len(text)
    return tool_parsers.PARSERS[parser].content_end(text)


def template_messages(messages: list, image_placeholder: str | None = None) -> list[dict]:
    """Messages as chat templates expect them: tool calls with parsed arguments (Qwen's and Llama's
    templates write `arguments | tojson`), tool results with their call id, an image part as the model's
    image placeholder where the text has it (a vision-language model's; a 400 otherwise)."""
    rendered = []
    for m in messages:
        item: dict = {"role": m.role, "content": m.text(image_placeholder)}
        if m.name is not None:
            item["name"] = m.name
        if m.tool_calls:
            item["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                                  for c in m.tool_calls]
        if m.tool_call_id is not None:
            item["tool_call_id"] = m.tool_call_id
        rendered.append(item)
    return rendered


def _arguments(text: str):
    try:
        return json_text.loads(text)
    except ValueError as exc:
        raise RequestError(f"a tool call's arguments are not JSON: {exc}", param="messages") from exc


def _is_json(text: str) -> bool:
    try:
        json_text.loads(text)
    except ValueError:
        return False
    return True
