"""OpenAI protocol request models (pydantic). Bounds live here so they appear in the OpenAPI schema;
SamplingParams checks them again for the Python API, and the engine checks what depends on the
model (token ids below its vocabulary size, prompt + max_tokens within its context length).

A field this server does not implement is refused with 400 naming it (extra="forbid"), never
silently ignored: a client that sends `response_format` or `logit_bias` must learn they did nothing."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from ortinf.errors import RequestError
from ortinf.runtime.sampling_params import MAX_LOGPROBS, SamplingParams

MAX_N = 16
MAX_PROMPTS = 256  # prompts in one completions request (each x n samples, within the server's capacity)
MAX_STOP = 64  # stop strings, and stop token ids, per request
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit
Finite = Annotated[float, Field(allow_inf_nan=False)]
TokenId = Annotated[int, Field(ge=0, description="a token id, below the model's vocabulary size (400 otherwise)")]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
STRICT = ConfigDict(extra="forbid")


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions (OpenAI's, plus vLLM's extensions)."""

    model_config = STRICT

    model: str | None = None
    temperature: Annotated[Finite, Field(ge=0.0, le=2.0, description="0 (or below 1e-5) is greedy")] | None = None
    top_p: Annotated[Finite, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[Finite, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[Finite, Field(gt=0.0)] | None = None
    presence_penalty: Annotated[Finite, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[Finite, Field(ge=-2.0, le=2.0)] | None = None
    seed: Annotated[int, Field(description="any integer; mapped into [0, 2**64) as vLLM does")] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP)] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def sampling_params(self, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None) -> SamplingParams:
        """SamplingParams for one sample; raises RequestError naming a bad parameter."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        values = dict(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            repetition_penalty=self.repetition_penalty or 1.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            seed=self.seed,
            stop=tuple(stop),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )
        return SamplingParams(**values)

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: str | Annotated[list[str], Field(max_length=MAX_PROMPTS)] | TokenIds | Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)]
    max_tokens: Annotated[int, Field(ge=0)] | None = 16
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool = False
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(t, int) for t in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list[dict] | None = None

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprobs_count(self) -> int | None:
        if self.top_logprobs and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs to be true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class EmbeddingRequest(BaseModel):
    """POST /v1/embeddings."""

    model_config = STRICT

    model: str | None = None
    input: (str | Annotated[list[str], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)] | TokenIds
            | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)])
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=1, description=(
        "keep at most this many tokens of each input (vLLM's field); without it, an input beyond the "
        "model's context length is a 400"))] | None = None
    user: str | None = None
