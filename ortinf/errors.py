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


class ShuttingDownError(OrtinfError):
    """The server's drain time ran out while this request was still running (the server answers 503)."""


class StepFailedError(OrtinfError):
    """An engine step failed while running this request: the request ended, the engine goes on.

    Not the user's fault (the server answers 500); `cause` is the original exception."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause
