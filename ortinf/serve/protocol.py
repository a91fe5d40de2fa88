"""OpenAI protocol request models (pydantic): types, and the limits that are the API's own (n, list lengths,
temperature <= 2). A sampling value's range is checked once, by SamplingParams (for every route and the Python
API alike), and the engine checks what depends on the model (token ids below its vocabulary size, prompt +
max_tokens within its context length).

The top-level request models take fields they do not declare (extra="allow"): what happens to each is
the compatibility policy (ortinf/serve/field_policy.py: ignored and named in a response header, or
refused with a 400 that says what to send instead). Nested objects stay strict (extra="forbid")."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ortinf.errors import RequestError
from ortinf.runtime.sample.sampling_params import MAX_BEAMS, MAX_LOGPROBS, SamplingParams
from ortinf.runtime.sample.structured_output import StructuredOutput
from ortinf.serve.policy_rules import GUIDED
from ortinf.tasks.chat.messages import (  # noqa: F401 - the request models name them
    IMAGE_PARTS,
    ChatMessage,
    ContentPart,
    FunctionCall,
    FunctionDef,
    NamedFunction,
    NamedToolChoice,
    Tool,
    ToolCallIn,
)

MAX_N = 16
MAX_PROMPTS = 256  # prompts in one completions request (each x n samples, within the server's capacity)
MAX_STOP = 64  # stop strings, and stop token ids, per request
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit
MAX_LOGIT_BIAS = 1024  # entries in logit_bias (each is applied on every step of the request)
TOKEN_ID_KEY = re.compile(r"\s*[0-9]{1,12}\s*")
Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenId = Annotated[int, Field(strict=True, ge=0, description="a token id, below the model's vocabulary size (400 otherwise)")]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
STRICT = ConfigDict(extra="forbid")
OPEN = ConfigDict(extra="allow")  # a request's top level: unknown fields go to the field policy
# Integer fields are strict (Field(strict=True)): pydantic's lax mode would read "2" and false as 2
# and 0 (`"n": "2"`, `prompt: [[false]]` were accepted); floats stay lax, so 1 is a valid temperature.


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False
    continuous_usage_stats: bool = Field(False, description="usage in every chunk, not only the last (vLLM's field)")


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = Field(None, description="accepted; the schema is always enforced")


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text, any JSON object, or JSON following a schema."""

    model_config = STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs: exactly one of json, regex, choice, grammar (Lark or GBNF), json_object."""

    model_config = STRICT

    json_: dict | bool | str | None = Field(None, alias="json", description="a JSON schema")
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1)] | None = None
    grammar: str | None = Field(None, description="a Lark grammar (llguidance's dialect) or a GBNF grammar")
    json_object: bool | None = None


def structured_output(response_format: ResponseFormat | None, structured: StructuredOutputs | None) -> StructuredOutput | None:
    """The request's output format, from OpenAI's response_format or vLLM's structured_outputs."""
    if response_format is not None and response_format.type != "text" and structured is not None:
        raise RequestError("send response_format or structured_outputs, not both", param="structured_outputs")
    if structured is not None:
        given = {name: value for name, value in (("json", structured.json_), ("regex", structured.regex), ("choice", structured.choice),
                                                 ("grammar", structured.grammar), ("json_object", structured.json_object or None))
                 if value is not None}
        if len(given) != 1:
            raise RequestError(f"structured_outputs needs exactly one of json, regex, choice, grammar, json_object (got {len(given)})",
                               param="structured_outputs")
        (kind, value), = given.items()
        if kind == "json":
            return StructuredOutput.json_schema(value, param="structured_outputs.json")
        if kind == "json_object":
            return StructuredOutput.json_schema({"type": "object"}, param="structured_outputs.json_object")
        if kind == "choice":
            return StructuredOutput.choice(value, param="structured_outputs.choice")
        return StructuredOutput(kind, value, param=f"structured_outputs.{kind}")
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return StructuredOutput.json_schema({"type": "object"})
    if response_format.json_schema is None:
        raise RequestError("response_format of type json_schema needs a json_schema object", param="response_format")
    return StructuredOutput.json_schema(response_format.json_schema.json_schema, param="response_format.json_schema")


def read_guided(data):  # a request body before validation
    """vLLM's older guided_json / guided_regex / guided_choice / guided_grammar, read as structured_outputs."""
    if not isinstance(data, dict):
        return data
    guided = {key: target for key, target in GUIDED.items() if data.get(key) is not None}
    if not guided:
        return data
    if data.get("structured_outputs") is not None:
        raise ValueError(f"send structured_outputs or {', '.join(guided)}, not both")
    if len(guided) > 1:
        raise ValueError(f"send one of {', '.join(guided)}")
    data = dict(data)
    (key, target), = guided.items()
    data["structured_outputs"] = {target: data.pop(key)}
    return data


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions (OpenAI's, plus vLLM's extensions)."""

    model_config = OPEN

    @model_validator(mode="before")
    @classmethod
    def _guided(cls, data):
        return read_guided(data)

    model: str | None = None
    temperature: Annotated[Finite, Field(ge=0.0, le=2.0, description="0 (or below 1e-5) is greedy")] | None = None
    # Types here, values once, in SamplingParams (ortinf/runtime/sample/sampling_params.py): a range is checked in
    # one place for every route and for LLM; what the API itself limits (temperature <= 2, n, list lengths) stays here
    top_p: Finite | None = Field(None, description="in (0, 1]")
    top_k: Annotated[int, Field(strict=True)] | None = Field(None, description="-1 or 0 disable it")
    min_p: Finite | None = Field(None, description="in [0, 1]")
    repetition_penalty: Finite | None = Field(None, description="> 0")
    presence_penalty: Finite | None = Field(None, description="in [-2, 2]")
    frequency_penalty: Finite | None = Field(None, description="in [-2, 2]")
    seed: Annotated[int, Field(strict=True, description="any integer; mapped into [0, 2**64) as vLLM does")] | None = None
    n: Annotated[int, Field(strict=True, ge=1, le=MAX_N)] = 1
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP)] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(strict=True)] = 0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    logit_bias: Annotated[dict[str, Finite], Field(max_length=MAX_LOGIT_BIAS)] | None = Field(
        None, description=f"token id (as a string) -> bias in [-100, 100] added to its logit before sampling; at most {MAX_LOGIT_BIAS} entries")
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    bad_words: Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: Annotated[int, Field(strict=True)] | None = Field(None, description=f"in [0, {MAX_LOGPROBS}]")
    truncate_prompt_tokens: Annotated[int, Field(strict=True)] | None = Field(None, description="keep only the last k >= 1 prompt tokens (vLLM's)")
    priority: Annotated[int, Field(strict=True, description="lower runs first (vLLM's; needs --scheduling-policy priority)")] = 0
    cache_salt: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        None, description="prefix-cache blocks are shared only between requests with the same salt (vLLM's)")
    request_id: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")] | None = Field(
        None, description="the response id's suffix (vLLM's)")
    add_special_tokens: bool | None = Field(None, description="add the tokenizer's special tokens to the prompt (vLLM's; "
                                                              "completions: true, chat: false, the template writes them)")
    best_of: Annotated[int, Field(strict=True, ge=1, le=MAX_BEAMS)] | None = Field(
        None, description="with use_beam_search: the number of beams (default n); without: accepted when it equals n (or 1)")
    use_beam_search: bool = Field(False, description="beam search (transformers' rules): max(n, best_of) beams, the n best returned")
    length_penalty: Finite | None = Field(None, description="beam search: a hypothesis scores sum(logprobs) / length ** length_penalty "
                                                           "(default 1.0)")
    early_stopping: bool | Literal["never"] | None = Field(None, description="beam search: true ends once enough hypotheses are done; "
                                                                       "false (default) by transformers' heuristic; never: when none can improve")

    def check_unimplemented(self) -> None:
        """400 for the values of accepted fields that ask for what this server does not do."""
        if self.use_beam_search:  # streamed, a search sends each of its n best whole once it ends
            return
        if self.best_of is not None and self.best_of not in (1, self.n):
            raise RequestError(f"best_of ({self.best_of}) larger than n asks for best-of sampling, which this server does not do: "
                               "send use_beam_search: true for beam search over best_of beams, or ask for n samples and pick by "
                               "their logprobs", param="best_of")
        for name, default in (("length_penalty", 1.0), ("early_stopping", False)):
            if getattr(self, name) not in (None, default):
                raise RequestError(f"{name} applies to beam search: send use_beam_search: true, or drop it", param=name)

    def sampling_params(self, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None) -> SamplingParams:
        """SamplingParams for one sample; raises RequestError naming a bad parameter."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        bias = {}
        for key, value in (self.logit_bias or {}).items():
            if not TOKEN_ID_KEY.fullmatch(key):  # ASCII digits only: int() refuses "²" and 5,000-digit numbers
                raise RequestError(f"logit_bias keys must be token ids, got {key[:40]!r}", param="logit_bias")
            bias[int(key)] = value
        values = dict(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else self.min_p,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=0.0 if self.presence_penalty is None else self.presence_penalty,
            frequency_penalty=0.0 if self.frequency_penalty is None else self.frequency_penalty,
            seed=self.seed,
            stop=tuple(stop),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs if prompt_logprobs is None else prompt_logprobs,
            structured_output=structured_output(self.response_format, self.structured_outputs),
            logit_bias=tuple(bias.items()),
            allowed_token_ids=tuple(self.allowed_token_ids) if self.allowed_token_ids else None,
            bad_words=tuple(self.bad_words or ()),
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
        )
        if not self.use_beam_search:
            return SamplingParams(**values)
        width = max(self.n, self.best_of or 1)
        if width == 1:  # one beam is greedy decoding (as in transformers); the fields beams refuse are refused all the same
            params = SamplingParams(**{**values, "temperature": 0.0})
            params.check_beam_fields()
            return params
        return SamplingParams(**values, n=self.n, num_beams=width,
                              length_penalty=1.0 if self.length_penalty is None else self.length_penalty,
                              early_stopping=False if self.early_stopping is None else self.early_stopping)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: str | Annotated[list[str], Field(max_length=MAX_PROMPTS)] | TokenIds | Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)]
    max_tokens: Annotated[int, Field(strict=True, ge=0)] | None = 16
    logprobs: Annotated[int, Field(strict=True)] | None = Field(None, description=f"in [0, {MAX_LOGPROBS}]")
    echo: bool = False

    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(t, int) for t in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    logprobs: bool = False
    # checked here: SamplingParams would name its own field, logprobs
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)] | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict | None = Field(None, description="extra variables for the chat template (e.g. enable_thinking)")
    add_generation_prompt: bool = True
    continue_final_message: bool = Field(False, description="end the prompt inside the last (assistant) message, to continue it")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = Field(
        None, description="passed to the chat template as reasoning_effort")
    modalities: list[Literal["text", "audio"]] | None = Field(None, description='["text"]: audio output is a 400')

    def check_unimplemented(self) -> None:
        super().check_unimplemented()
        if self.modalities and "audio" in self.modalities:
            raise RequestError("audio output is not supported by this server: this model writes text, set modalities to [\"text\"]",
                               param="modalities")

    def template_kwargs(self) -> dict | None:
        """chat_template_kwargs, with reasoning_effort when given (templates such as gpt-oss's read it)."""
        if self.reasoning_effort is None:
            return self.chat_template_kwargs
        return {"reasoning_effort": self.reasoning_effort, **(self.chat_template_kwargs or {})}

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprobs_count(self) -> int | None:
        if self.top_logprobs and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs to be true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class EmbeddingRequest(BaseModel):
    """POST /v1/embeddings."""

    model_config = OPEN

    model: str | None = None
    input: (str | Annotated[list[str], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)] | TokenIds
            | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)])
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(strict=True, ge=1)] | None = None
    truncate_prompt_tokens: Annotated[int, Field(strict=True, ge=1, description=(
        "keep at most this many tokens of each input (vLLM's field); without it, an input beyond the "
        "model's context length is a 400"))] | None = None
    user: str | None = None
