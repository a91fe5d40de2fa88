"""Errors in the shape of the API a path speaks (each front-end's record in ortinf/serve/api says how: OpenAI's
`{"error": {"message", "type", "param", "code"}}`, Anthropic's `{"type": "error", "error": {"type", "message"}}` on
/v1/messages, Ollama's `{"error": "..."}` on /api/). The only place that maps ortinf's errors onto HTTP statuses."""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ortinf.errors import ConfigError, ContextLengthError, OrtinfError, RequestError, ShuttingDownError, StepFailedError
from ortinf.runtime.engine.async_engine import EngineDeadError

log = logging.getLogger(__name__)

MAX_MESSAGE = 300  # messages never echo huge inputs back

class APIError(Exception):
    """An error the server answers with, raised from route code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None,
                 wording: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers
        self.wording = wording or {}  # the message as another dialect words the same case ({"anthropic": ...}), where its clients read it


def error_body(status: int, message: str, param: str | None = None, code: str | None = None, path: str = "",
               wording: dict[str, str] | None = None) -> dict:
    """The error as the API of `path` shapes and words it (its front-end, ortinf/serve/api; `wording`: a front-end's own
    words for the case, by its name)."""
    from ortinf.serve.api import speaking  # the front-ends import this module

    front = speaking(path)
    message = (wording or {}).get(front.name, message)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    # a message may quote the request (a model name): lone surrogates cannot be written as UTF-8
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return front.error_body(status, message, param, code)


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None, path: str = "", wording: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code, path, wording), status_code=status, headers=headers)


def respond(err: APIError, path: str) -> JSONResponse:
    return error_response(err.status, err.message, err.param, err.code, err.headers, path, err.wording)


def from_exception(exc: BaseException) -> APIError:
    """The APIError for any exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextLengthError):
        return APIError(400, str(exc), param=exc.param, code="context_length_exceeded", wording={"anthropic": exc.anthropic_message()})
    if isinstance(exc, RequestError):
        return APIError(400, str(exc), param=exc.param)
    if isinstance(exc, StepFailedError):
        return APIError(500, str(exc), code="request_failed")
    if isinstance(exc, ShuttingDownError):
        return APIError(503, str(exc), code="server_shutting_down")
    if isinstance(exc, (ConfigError, OrtinfError)):
        return APIError(400, str(exc))
    if isinstance(exc, EngineDeadError):
        return APIError(500, str(exc), code="engine_failed")
    log.exception("unexpected error while serving a request", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")


# pydantic names the branch of a union it tried in the error's location: not a parameter name
_UNION_BRANCH = re.compile(r"^(str|int|float|bool|none|constrained-\S*|function-\S*|\S*\[.*\])$")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = [dict(e, loc=tuple(p for p in e.get("loc", ()) if not (isinstance(p, str) and _UNION_BRANCH.match(p))))
              for e in exc.errors()]
    if not errors:
        return "invalid request body", None
    # a union field reports one error per branch: a broken bound (too long, too large) says more
    # than "not a string" from the branches the value was never meant for
    first = next((e for e in errors if not str(e.get("type", "")).endswith(("_type", "_parsing"))), errors[0])
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    if first.get("type") == "value_error":  # a model's own check (protocol.py validators): its message says what to change
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        return str(first.get("msg", "invalid value")).removeprefix("Value error, "), ".".join(loc) or None
    if tuple(first.get("loc", ())) == ("body",):
        return "the request body must be a JSON object (send it with Content-Type: application/json)", None
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        return f"{param} is not supported by this server: remove it from the request", param
    message = first.get("msg", "invalid value")
    return (f"{param}: {message}" if param else message), param


ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
                   "code": {"type": ["string", "null"]}}}}}
# What each route may answer besides 200, as the server really sends it (never FastAPI's 422 shape)
ERRORS_SENT = {
    "post": {400: "invalid request (a field, its bounds, or what the model allows)", 401: "missing or wrong API key",
             404: "no such model", 413: "request body too large", 429: "the server is at capacity; retry later",
             500: "the request failed in the engine", 503: "the model is loading, or the server is shutting down"},
    "get": {401: "missing or wrong API key", 500: "internal error", 503: "the model is loading"},
}


def document_errors(schema: dict) -> dict:
    """The OpenAPI schema with the error responses each route really sends, in OpenAI's shape, and
    without the 422 FastAPI documents by default (validation errors are 400s here)."""
    schema.setdefault("components", {}).setdefault("schemas", {})["ErrorResponse"] = ERROR_SCHEMA
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            if path == "/health":
                sent = {503: "not healthy: a model is loading or failed, or an engine died"}
            elif path.startswith("/v1/") or path in ("/tokenize", "/detokenize"):
                sent = dict(ERRORS_SENT.get(method, {}))
                if "{" in path:
                    sent[404] = "no such model"
            else:
                continue
            for status, description in sorted(sent.items()):
                responses.setdefault(str(status), {"description": description, "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})
    schema.get("components", {}).get("schemas", {}).pop("HTTPValidationError", None)
    schema.get("components", {}).get("schemas", {}).pop("ValidationError", None)
    return schema


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves the server in OpenAI's shape (never FastAPI's default 422 shape), and the
    OpenAPI schema says so."""
    default_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = document_errors(default_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return respond(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, param, path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers, path=request.url.path)  # a 405 keeps its Allow header

    @app.exception_handler(OrtinfError)
    async def _ortinf(request: Request, exc: OrtinfError) -> JSONResponse:
        return respond(from_exception(exc), request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return respond(from_exception(exc), request.url.path)
