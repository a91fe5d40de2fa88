"""The models a server serves, by name: a generating engine or an encoder, each with its tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from tokenizers import Tokenizer

from ortinf.manifest import FEATURE_EXTRACTION, Manifest
from ortinf.runtime.engine.async_engine import AsyncEngine
from ortinf.runtime.worker.encoder_graph import EncoderGraph
from ortinf.serve.errors import APIError
from ortinf.tasks.chat.chat import Chat
from ortinf.tasks.chat.reasoning import HarmonyParser, ReasoningParser
from ortinf.tasks.chat.template import ChatTemplate
from ortinf.tasks.pooling import Pooling
from ortinf.tokenizer import TokenBytes


@dataclass(slots=True)
class ServedModel:
    """One package behind the API."""

    name: str
    package_dir: Path
    manifest: Manifest
    engine: AsyncEngine | None = None
    pooling: Pooling | None = None  # an encoder package's tasks (ortinf/tasks/pooling.py), over `pooler`
    pooler: AsyncEngine | None = None  # the encoder's PoolingEngine on its own engine thread: inputs batched across requests
    chat: Chat | None = None  # a generating package's conversation front-end (ortinf/tasks/chat/chat.py)
    _token_bytes: TokenBytes | None = None
    created: int = 0
    transcriber: object | None = None  # a speech-recognition package's runtime/async_transcriber.AsyncTranscriber
    lora_name: str | None = None  # set on the view of a LoRA adapter (its requests run with it)
    parent: str | None = None  # the base model's name, for an adapter
    load_seconds: float = 0.0  # opening the package until it was ready to serve (ortinf/serve/app.py load_model)

    @property
    def tokenizer(self) -> Tokenizer | None:
        if self.engine is not None:
            return self.engine.engine.tokenizer
        return self.encoder.tokenizer if self.encoder is not None else None

    @property
    def engines(self) -> list[AsyncEngine]:
        """Its stepping threads: the generating engine (text, text2text and speech alike) or the encoder's."""
        return [engine for engine in (self.engine, self.pooler) if engine is not None]

    @property
    def encoder(self) -> EncoderGraph | None:
        return self.pooling.encoder if self.pooling is not None else None

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self.chat.template if self.chat is not None else None

    @property
    def tool_parser(self) -> str | None:
        return self.chat.tool_parser if self.chat is not None else None

    @property
    def reasoning_parser(self) -> ReasoningParser | HarmonyParser | None:
        return self.chat.reasoning_parser if self.chat is not None else None

    @property
    def image_placeholder(self) -> str | None:
        """The text of a vision-language model's image token (where an image part goes in the chat template), else None."""
        return self.chat.placeholder if self.chat is not None else None

    def token_text(self, token_id: int) -> str:
        """How a token is shown in logprobs: its text, or `token_id:N` without a tokenizer."""
        tokenizer = self.tokenizer
        if tokenizer is None:
            return f"token_id:{token_id}"
        return tokenizer.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> list[int]:
        """A token's bytes for logprobs (its own bytes, not those of its decoded text)."""
        tokenizer = self.tokenizer
        if tokenizer is None:
            return list(self.token_text(token_id).encode())
        if self._token_bytes is None:
            self._token_bytes = TokenBytes(tokenizer)
        return list(self._token_bytes(token_id))

    @property
    def fingerprint(self) -> str:
        """OpenAI's system_fingerprint: what produced the output (runtime version, provider, precision)."""
        from ortinf import __version__

        provider = self.engine.engine.graph.provider.name if self.engine is not None else "encoder"
        return f"ortinf-{__version__}-{provider}-{self.manifest.dtype}"

    def require_engine(self) -> AsyncEngine:
        if self.engine is None:
            raise APIError(400, f"model '{self.name}' is a {self.manifest.task} model: use /v1/embeddings", param="model")
        return self.engine

    def require_embeddings(self) -> Pooling:
        if self.pooling is None or self.manifest.task != FEATURE_EXTRACTION:
            raise APIError(400, f"model '{self.name}' is a {self.manifest.task} model and does not embed", param="model")
        return self.pooling


class ModelRegistry:
    """Models by served name; requests are routed by their `model` field."""

    def __init__(self) -> None:
        self.models: dict[str, ServedModel] = {}
        self.loras: dict[str, str] = {}  # LoRA adapter name -> its base model's name

    def add(self, model: ServedModel) -> None:
        self.models[model.name] = model

    def add_lora(self, name: str, base: str) -> None:
        if name in self.models:
            raise APIError(400, f"'{name}' is already a model's name: name the adapter otherwise", param="lora_name")
        self.loras[name] = base

    def adapters(self) -> list[ServedModel]:
        return [self.get(name) for name in self.loras]

    @property
    def names(self) -> list[str]:
        return sorted([*self.models, *self.loras])

    def get(self, name: str | None) -> ServedModel:
        if name is None:
            if len(self.models) == 1:
                return next(iter(self.models.values()))
            raise APIError(400, f"pass `model`: this server serves {', '.join(self.names)}", param="model")
        model = self.models.get(name)
        if model is None and name in self.loras:  # the base model's engine, running the adapter
            return replace(self.models[self.loras[name]], name=name, lora_name=name, parent=self.loras[name])
        if model is None:
            raise APIError(404, f"the model '{name[:100]}' does not exist; available: {', '.join(self.names)}",
                           param="model", code="model_not_found")
        return model
