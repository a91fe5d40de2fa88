"""Ollama's API: /api/chat, /api/generate, embeddings, the model listings and the heartbeat Ollama's tools use."""

from __future__ import annotations

from ortinf.serve.api import FrontEnd
from ortinf.serve.api.ollama.policy import POLICY


def error_body(status: int, message: str, param: str | None, code: str | None) -> dict:
    return {"error": message}


FRONT_END = FrontEnd("ollama", lambda config: [f"{__name__}.routes"], lambda path: path.startswith("/api/"), error_body,
                     ("/api/chat", "/api/generate"), POLICY)
