"""A package's kind as a type: what open_package (ortinf/tasks/package.py) returns, and what LLM and the server hold.

Three kinds, each with one engine:
- TextTask: a decoder, or a text encoder-decoder (Marian, BART): an LLMEngine (its requests: ortinf/tasks/text.py);
- SpeechTask: Whisper: a Transcriber (ortinf/tasks/speech/transcriber.py), whose windows are requests of its LLMEngine;
- PoolingTask: an encoder (embeddings, classification, rerank): Pooling (ortinf/tasks/pooling.py) over a PoolingEngine.

Every kind answers the same questions (name, engine, tokenizer, card, close), so a caller asks which kind it holds
once (isinstance) instead of checking which of several optional fields is set, and what only one kind has (LoRA
adapters, the transcriber, the pooling) is that kind's, asked of it rather than of the engine behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ortinf.manifest import Manifest

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ortinf.runtime.engine.llm_engine import LLMEngine
    from ortinf.runtime.engine.pooling_engine import PoolingEngine
    from ortinf.runtime.worker.lora import LoraAdapter
    from ortinf.tasks.pooling import Pooling
    from ortinf.tasks.speech.transcriber import Transcriber


@dataclass(frozen=True, slots=True)
class Card:
    """What a listing says of a package (/v1/models, Ollama's /api/ps and /api/show)."""

    task: str  # the manifest's task
    max_model_len: int  # the context a request may fill (the engine's, which may be less than the package's)
    modalities: tuple[str, ...]  # what a request may carry: text, image (vision-language), audio (speech)


class Task:
    """One opened package of one kind. `name`: the served name (the server's), else the package folder's. The answers
    here are an LLMEngine's (text and speech alike); PoolingTask gives an encoder's."""

    engine: LLMEngine | PoolingEngine  # the one engine the kind steps (a server runs it on a stepping thread of its own)
    modalities: tuple[str, ...] = ("text",)  # what a request may carry

    def __init__(self, name: str, package_dir: Path, manifest: Manifest) -> None:
        self.name, self.package_dir, self.manifest = name, package_dir, manifest

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The package's tokenizer, None where it has none (ids in, ids out)."""
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def provider(self) -> str:
        """The execution provider its graphs run on (OpenAI's system_fingerprint names it)."""
        return self.engine.graph.provider.name

    def card(self) -> Card:
        return Card(self.manifest.task, self.max_model_len, self.modalities)

    def wait_until_resident(self) -> None:
        """Returns once its memory is mapped (a large KV pool maps in the background), so what it takes can be measured."""
        self.engine.wait_until_resident()

    def close(self) -> None:
        """Writes out what the engine still has queued (the prefix store's blocks): once nothing steps it any more. A
        server's stepping thread does this as it shuts down (AsyncEngine.shutdown)."""
        self.engine.close()


class TextTask(Task):
    """Text generation and text2text: an LLMEngine (LLM.generate, the generating routes)."""

    def __init__(self, name: str, package_dir: Path, manifest: Manifest, engine: LLMEngine) -> None:
        super().__init__(name, package_dir, manifest)
        self.engine = engine
        self.modalities = ("text", "image") if manifest.vision is not None else ("text",)

    @property
    def serves_loras(self) -> bool:
        """Whether the engine has LoRA slots (max_loras > 0 on a package exported with --enable-lora)."""
        return self.engine.loras is not None

    def lora_path(self, name: str) -> str | None:
        """The folder a loaded adapter was read from, None for a name not loaded."""
        adapter = self.engine.loras.adapters.get(name) if self.engine.loras is not None else None
        return str(adapter.path) if adapter is not None else None

    def read_lora(self, name: str, path: str) -> LoraAdapter:
        """A PEFT folder read and checked against this model's graph (off the engine's thread: the engine then only
        writes its slot, LLMEngine.add_lora)."""
        from ortinf.runtime.worker.lora import LoraAdapter

        return LoraAdapter.load(name, path, self.engine.graph.spec)


class SpeechTask(Task):
    """Whisper: its Transcriber, whose windows are requests of the transcriber's LLMEngine (`engine`)."""

    modalities = ("audio",)

    def __init__(self, name: str, package_dir: Path, manifest: Manifest, transcriber: Transcriber) -> None:
        super().__init__(name, package_dir, manifest)
        self.transcriber = transcriber
        self.engine = transcriber.engine
        # `tokenizer` is the engine's (the manifest's); the transcriber also reads a tokenizer.json added after export


class PoolingTask(Task):
    """An encoder: Pooling (embeddings, pair scores, classification) over its PoolingEngine (`engine`)."""

    def __init__(self, name: str, package_dir: Path, manifest: Manifest, pooling: Pooling) -> None:
        super().__init__(name, package_dir, manifest)
        self.pooling = pooling
        self.engine = pooling.engine

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.pooling.encoder.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.manifest.encoder.max_model_len

    @property
    def provider(self) -> str:
        return self.pooling.encoder.provider.provider.name  # a Found (the provider, and the devices it found)

    def wait_until_resident(self) -> None:
        """An encoder has no KV pool: its weights are mapped as its session is created."""

    def close(self) -> None:
        """Nothing is queued: an encoder writes nothing out."""


__all__ = ["Card", "PoolingTask", "SpeechTask", "Task", "TextTask"]
