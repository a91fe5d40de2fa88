"""OpenAI's API, and vLLM's routes beside it: chat and text completions, the Responses API (its tools, its store),
embeddings, audio transcription, /tokenize and /detokenize, rerank/score/classify, and runtime LoRA loading."""

from __future__ import annotations

import importlib.util

from ortinf.serve.api import FrontEnd
from ortinf.serve.api.openai.policy import POLICY

# OpenAI's error types by status (https://platform.openai.com/docs/guides/error-codes)
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error",
         429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}


def error_body(status: int, message: str, param: str | None, code: str | None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param, "code": code}}


def routes(config) -> list[str]:  # a ServerConfig
    mounted = [f"{__name__}.{name}" for name in ("completions", "chat", "responses", "embeddings", "scoring", "tokens")]
    if config.allow_runtime_lora_updates:
        mounted.append(f"{__name__}.lora")
    if importlib.util.find_spec("multipart") is not None:  # FastAPI's form parsing (the audio extra)
        mounted.append(f"{__name__}.audio")
    return mounted


# speaks no path of its own: it is the default dialect, of every path no other front-end speaks
FRONT_END = FrontEnd("openai", routes, lambda path: False, error_body, ("/v1/chat/completions", "/v1/responses"), POLICY)
