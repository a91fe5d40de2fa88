"""The typed error hierarchy. Every message says what to change; serve/ maps these onto HTTP."""

from __future__ import annotations


class OrtinfError(Exception):
    """Base class of every error ortinf raises on purpose (a user error, not a bug)."""


class ConfigError(OrtinfError):
    """A configuration value, a config file or a model package is wrong or unreadable."""


class ExportError(OrtinfError):
    """A model cannot be exported (missing, unsupported, or it failed verification)."""


class UnsupportedArchitectureError(ExportError):
    """The model's architecture or task is not one the exporter supports."""


class ProviderUnavailableError(OrtinfError):
    """The requested ONNX Runtime execution provider is not available in this install."""


class RequestError(OrtinfError):
    """A request carries invalid parameters; `param` names the offending one where there is one."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(RequestError):
    """A request that cannot fit the context length: its prompt alone (`max_tokens` None), or its prompt and max_tokens.
    `prompt_tokens` None: a prompt known too long by its characters before it was tokenised. The server answers 400 with
    OpenAI's code context_length_exceeded, worded on /v1/messages as Anthropic's API words it (Claude Code retries with a
    smaller max_tokens, or compacts the conversation, only on those words)."""

    def __init__(self, message: str, prompt_tokens: int | None, max_tokens: int | None, max_model_len: int, param: str = "max_tokens") -> None:
        super().__init__(message, param)
        self.prompt_tokens, self.max_tokens, self.max_model_len = prompt_tokens, max_tokens, max_model_len

    def anthropic_message(self) -> str:
        if self.max_tokens is not None and self.prompt_tokens is not None and self.prompt_tokens < self.max_model_len:
            return (f"input length and `max_tokens` exceed context limit: {self.prompt_tokens} + {self.max_tokens} > "
                    f"{self.max_model_len}, decrease input length or `max_tokens` and try again")
        tokens = self.prompt_tokens if self.prompt_tokens is not None else f"more than {self.max_model_len}"
        return f"prompt is too long: {tokens} tokens > {self.max_model_len} maximum"


class ShuttingDownError(OrtinfError):
    """The server's drain time ran out while this request was still running (the server answers 503)."""


class StepFailedError(OrtinfError):
    """An engine step failed while running this request: the request ended, the engine goes on.

    Not the user's fault (the server answers 500); `cause` is the original exception."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause
