"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens, a front-end over the chat path."""

from __future__ import annotations

from ortinf.serve.api import FrontEnd
from ortinf.serve.api.anthropic.policy import POLICY

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors)
TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
         413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


def error_body(status: int, message: str, param: str | None, code: str | None) -> dict:
    return {"type": "error", "error": {"type": TYPES.get(status, "api_error"), "message": message}}


def speaks(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


FRONT_END = FrontEnd("anthropic", lambda config: [f"{__name__}.routes"], speaks, error_body, ("/v1/messages", "/v1/messages/count_tokens"),
                     POLICY)
