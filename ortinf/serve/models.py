"""The models a server serves, by name: each one package's task (ortinf/tasks/kinds.py: text, speech or pooling) on a
stepping thread of its own, with what its kind's routes use beside it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from ortinf.manifest import FEATURE_EXTRACTION, Manifest
from ortinf.runtime.engine.async_engine import AsyncEngine
from ortinf.serve.errors import APIError
from ortinf.tasks.chat.chat import Chat
from ortinf.tasks.chat.reasoning import HarmonyParser, ReasoningParser
from ortinf.tasks.chat.template import ChatTemplate
from ortinf.tasks.kinds import PoolingTask, SpeechTask, Task, TextTask
from ortinf.tasks.pooling import Pooling
from ortinf.tokenizer import TokenBytes

if TYPE_CHECKING:
    from ortinf.serve.config import ServerConfig
    from ortinf.tasks.chat.media import MediaPolicy
    from ortinf.tasks.chat.messages import ChatMessage
    from ortinf.tasks.speech.async_transcriber import AsyncTranscriber


@dataclass(slots=True)
class ServedModel:
    """One package behind the API: its task, that task's engine on its stepping thread (every request's inputs batched
    there), and a text task's chat or a speech task's transcriber on that thread. Routes ask the task which kind it
    is (`require_engine`, `require_embeddings`, `require_speech`, or isinstance on `task`)."""

    name: str
    task: Task
    engine: AsyncEngine  # the task's engine (an LLMEngine, or an encoder's PoolingEngine) on its own thread
    chat: Chat | None = None  # a text task's conversation front-end (ortinf/tasks/chat/chat.py)
    transcriber: AsyncTranscriber | None = None  # a speech task's jobs on `engine` (ortinf/tasks/speech/async_transcriber.py)
    created: int = 0
    lora_name: str | None = None  # set on the view of a LoRA adapter (its requests run with it)
    parent: str | None = None  # the base model's name, for an adapter
    load_seconds: float = 0.0  # opening the package until it was ready to serve (ortinf/serve/app.py load_model)
    _token_bytes: TokenBytes | None = None

    @classmethod
    def start(cls, name: str, task: Task, config: ServerConfig, on_step: Callable | None = None,
              on_dead: Callable[[BaseException], None] | None = None) -> ServedModel:
        """`task` served as `name`: its engine started on a stepping thread (`on_step`, `on_dead`: AsyncEngine's), with
        a text task's chat (the server's parsers) or a speech task's transcriber (the server's fallback rule)."""
        engine = AsyncEngine(task.engine, on_step=on_step, on_dead=on_dead)
        model = cls(name, task, engine, created=int(time.time()))
        if isinstance(task, TextTask):
            model.chat = Chat.load(task.package_dir, task.tokenizer, task.manifest.vision, config.tool_call_parser,
                                   config.reasoning_parser)
        elif isinstance(task, SpeechTask):  # the one engine: a window is an ordinary request of the model's AsyncEngine
            from ortinf.tasks.speech.async_transcriber import AsyncTranscriber

            model.transcriber = AsyncTranscriber(task.transcriber, engine, fallback=config.transcription_fallback)
        return model

    @property
    def package_dir(self) -> Path:
        return self.task.package_dir

    @property
    def manifest(self) -> Manifest:
        return self.task.manifest

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.task.tokenizer

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

    def images(self, messages: Sequence[ChatMessage], policy: MediaPolicy | None = None) -> list[bytes]:
        """A conversation's images, read (a vision-language model's; none for a model without a chat: a speech one)."""
        return self.chat.images(messages, policy) if self.chat is not None else []

    def has_images(self, messages: Sequence[ChatMessage]) -> bool:
        """Whether a conversation carries images (it is then prepared on the media pool, under admission)."""
        return self.chat is not None and self.chat.has_images(messages)

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

        return f"ortinf-{__version__}-{self.task.provider}-{self.manifest.dtype}"

    def require_engine(self) -> AsyncEngine:
        """The generating engine (a text or a speech task's), else a 400."""
        if isinstance(self.task, PoolingTask):
            raise APIError(400, f"model '{self.name}' is a {self.manifest.task} model: use /v1/embeddings", param="model")
        return self.engine

    def require_embeddings(self) -> Pooling:
        if not isinstance(self.task, PoolingTask) or self.manifest.task != FEATURE_EXTRACTION:
            raise APIError(400, f"model '{self.name}' is a {self.manifest.task} model and does not embed", param="model")
        return self.task.pooling

    def require_speech(self) -> AsyncTranscriber:
        if not isinstance(self.task, SpeechTask):
            raise APIError(400, f"model '{self.name}' is a {self.manifest.task} model, not speech recognition", param="model")
        return self.transcriber  # type: ignore[return-value] - `start` gives every speech task its transcriber

    def drop(self) -> None:
        """Lets go of the task and everything over it once its engine has stopped (an unload), so that whatever still
        holds this record (a finished request's frame) does not keep the sessions and the KV pool alive."""
        for name in ("task", "engine", "chat", "transcriber", "_token_bytes"):
            delattr(self, name)


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
