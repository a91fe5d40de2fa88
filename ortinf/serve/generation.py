"""What the generating routes share (chat and text completions, the Responses API, and the Anthropic and Ollama
front-ends): a request's samples prepared through ortinf/tasks/text.py, a conversation rendered through the
model's Chat, its tool plan and sampling parameters, the reasoning split, usage and response ids. Routes import
this, never each other."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from pydantic import ValidationError

from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.runtime.engine.prepared import PreparedRequest
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.serve.errors import APIError
from ortinf.serve.models import ServedModel
from ortinf.serve.protocol import ChatCompletionRequest, SamplingFields
from ortinf.tasks.chat import tool_parsers
from ortinf.tasks.chat.tools import ToolCall, ToolPlan, held_back, plan
from ortinf.tasks.text import samples


def prepare_samples(model: ServedModel, prompts: list, body_params, n: int, stream: bool, body: SamplingFields | None = None,
                    add_special_tokens: bool = True, images: list | None = None, cache_salt: str | None = None) -> list[PreparedRequest]:
    """One PreparedRequest per prompt x sample (prompt-major); validation happens here, before any runs.
    A stream's engine outputs are deltas (each only what is new), which the route frames; a
    non-streamed request's is one final output per sample (no per-step wake-up, no text rebuilt).
    `body`: the request, for its priority and cache_salt (`cache_salt`: a route's salt without such a body, the
    Responses API's); `images`: a chat's images (one prompt), in order."""
    engine = model.require_engine()
    priority, salt = (body.priority, body.cache_salt) if body is not None else (0, cache_salt)
    prepared = []
    for prompt in prompts:
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        prepared += samples(engine, prompt, body_params, n, output_kind="delta" if stream else "final_only", lora_name=model.lora_name,
                                 add_special_tokens=add_special_tokens, priority=priority, cache_salt=salt, images=images or ())
    return prepared


def usage(prepared: list[PreparedRequest], n: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """OpenAI's usage; prompt_tokens_details.cached_tokens is the prefix-cache hit of each prompt's first sample."""
    prompt_tokens = sum(p.num_prompt_tokens for p in prepared[::n])
    body = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


def cached_tokens(outputs: list[RequestOutput], n: int) -> int:
    return sum(o.num_cached_tokens or 0 for o in outputs[::n])


def request_ids(prefix: str, body: SamplingFields) -> tuple[str, str]:
    """(the response's id, the engine's id for its samples): the client's request_id names the response;
    the engine's id adds a random part, so two clients sending the same request_id never collide."""
    suffix = uuid.uuid4().hex
    if body.request_id is None:
        return f"{prefix}-{suffix}", f"{prefix}-{suffix}"
    return f"{prefix}-{body.request_id}", f"{prefix}-{body.request_id}-{suffix[:12]}"


def render_prompt(model: ServedModel, body: ChatCompletionRequest, tools: ToolPlan | None = None, add_special_tokens: bool = False) -> list[int]:
    """The conversation as token ids, through the model's chat (ortinf/tasks/chat/chat.py)."""
    if model.chat_template is None or model.tokenizer is None:
        raise APIError(400, f"model '{model.name}' has no chat template: use /v1/completions", param="messages")
    return model.chat.prompt(body.messages, add_generation_prompt=body.add_generation_prompt, tools=tools.tools if tools else None,
                             extra=body.template_kwargs(), continue_final_message=body.continue_final_message,
                             add_special_tokens=add_special_tokens)


def tool_plan(model: ServedModel, body: ChatCompletionRequest, default_choice: str = "auto") -> ToolPlan:
    """The request's tool plan; `default_choice` (--default-tool-choice) replaces a tool_choice left at auto."""
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    choice = body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump") else body.tool_choice
    if tools and choice in (None, "auto"):
        choice = default_choice
    return plan(tools, choice, body.parallel_tool_calls, model.tool_parser)


def chat_params(model: ServedModel, body: ChatCompletionRequest, tools: ToolPlan, logprobs: int | None) -> SamplingParams:
    """The sampling parameters of a chat request, with its tool plan's format and what its parser needs."""
    params = body.sampling_params(body.max_new_tokens(), logprobs)
    if tools.structured_output is not None:
        # the reply must be a call: response_format (text.format) shapes text replies, so it has nothing to shape here
        # (OpenAI accepts both; the Agents SDK sends both when an agent has an output type and a required tool)
        params = replace(params, structured_output=tools.structured_output)
    if ((tools.mode == "auto" and tool_parsers.PARSERS[model.tool_parser].keeps_special_tokens)
            or (model.reasoning_parser is not None and model.reasoning_parser.keeps_special_tokens)):
        params = replace(params, skip_special_tokens=False)  # the parser's markers are special tokens
    return params


def split_reasoning(model: ServedModel, text: str, finished: bool = True) -> tuple[str | None, str | None]:
    """(thinking, answer) of an output: the answer alone where the model has no reasoning parser."""
    if model.reasoning_parser is None:
        return None, text
    return model.reasoning_parser.split(text, finished)


def as_chat_request(fields: dict, names: dict[str, str] | None = None) -> ChatCompletionRequest:
    """The chat completion another API's request means (the Responses, Anthropic and Ollama routes), its fields'
    errors a 400 naming the field (`names`: how that API spells a chat field, for the message)."""
    try:
        return ChatCompletionRequest.model_validate({key: value for key, value in fields.items() if value is not None})
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(part) for part in error.get("loc", ())]
        if loc and names:
            loc[0] = names.get(loc[0], loc[0])
        where = ".".join(loc)
        raise APIError(400, f"{where}: {error.get('msg', 'invalid value')}", param=loc[0] if loc else None) from None


def count_prompt_tokens(model: ServedModel, ids: list[int], images: list) -> int:
    """A rendered prompt's tokens, each image's placeholder counted as the tokens it becomes (its size's)."""
    if not images:
        return len(ids)
    return len(samples(model.require_engine(), ids, SamplingParams(), images=images)[0].token_ids)


@dataclass(slots=True)
class Reply:
    """One sample's reply as its deltas arrive, for a route that streams it in its own framing: what of the
    thinking (with a reasoning parser) and of the answer may be sent now (text that may belong to a tool call is
    held back until the output ends), and once it ends the answer's content and tool calls, read by the plan."""

    model: ServedModel
    tools: ToolPlan
    text: str = ""
    said: int = 0  # thinking characters handed out
    sent: int = 0  # answer characters handed out
    reasoning: str | None = None  # once finished: the whole thinking (None: the model did not think)
    content: str | None = None  # once finished: the answer's text besides its calls
    calls: list[ToolCall] = field(default_factory=list)

    def feed(self, delta: str, finished: bool, cut: bool = False) -> tuple[str, str]:
        """(new thinking, new answer text) that may be sent after this delta of the output (`cut`: max_tokens ended it,
        so a call it ended inside is read with the arguments produced so far)."""
        self.text += delta
        reasoning, answer = split_reasoning(self.model, self.text, finished)
        thinking = ""
        if reasoning is not None and len(reasoning) > self.said:
            thinking, self.said = reasoning[self.said:], len(reasoning)
        answer = answer or ""
        visible = len(answer) if finished else held_back(answer, self.tools.mode, self.model.tool_parser)
        if finished:
            self.reasoning = reasoning
            self.content, self.calls = self.tools.parse(answer, self.model.tool_parser, cut) if self.tools.mode != "none" else (answer, [])
            if self.calls:
                visible = len(self.content or "") if self.tools.mode == "auto" else 0
        new = answer[self.sent:max(visible, self.sent)]
        self.sent = max(visible, self.sent)
        return thinking, new


__all__ = [
    "Reply",
    "as_chat_request",
    "count_prompt_tokens",
    "cached_tokens",
    "chat_params",
    "prepare_samples",
    "render_prompt",
    "request_ids",
    "split_reasoning",
    "tool_plan",
    "usage",
]
