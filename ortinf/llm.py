"""The offline Python API: `LLM(package).generate(prompts, SamplingParams(...))` and `.embed(texts)`."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from ortinf.errors import ConfigError, RequestError
from ortinf.manifest import TEXT2TEXT
from ortinf.runtime.engine.outputs import RequestOutput
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.tasks import driver, text
from ortinf.tasks.kinds import PoolingTask, SpeechTask, TextTask
from ortinf.tasks.package import open_package
from ortinf.tasks.programs import Program

if TYPE_CHECKING:
    from ortinf.runtime.engine.llm_engine import LLMEngine

Prompt = str | Sequence[int] | dict  # a dict: {"prompt": text or ids, "multi_modal_data": {"image": one or a list}} (vLLM's)


class LLM:
    """An exported package (or a Hugging Face model folder, exported into the package cache on first
    use, or a bundled model's name; none: the bundled demo llama), ready to generate (decoders) or
    embed (encoders).

    Keyword options are EngineConfig's fields: block_size, num_blocks, kv_cache_memory,
    max_num_seqs, max_num_batched_tokens, max_model_len, enable_prefix_caching, intra_op_threads, seed,
    provider_options (a dict of the provider's options), allow_cpu_fallback, speculative_config (vLLM's dict or JSON,
    e.g. {"method": "ngram", "num_speculative_tokens": 4}), lora_modules ({name: PEFT folder}, on a package
    exported with --enable-lora), max_loras, max_lora_rank. Whisper, Marian and BART packages run on the same
    engine and take the same options; encoder packages (embeddings, classification) take max_num_seqs and max_num_batched_tokens
    (the rows and padded tokens of one encoder step), intra_op_threads,
    provider_options and allow_cpu_fallback. An option a package kind cannot use is a ConfigError.
    """

    def __init__(self, package_dir: str | Path | None = None, provider: str = "auto", **options: Any) -> None:
        from ortinf.bundled import resolve_package
        from ortinf.config import SpeculativeConfig

        package_dir = resolve_package(package_dir)  # a Hugging Face folder is exported into the package cache once
        spec = SpeculativeConfig.parse(options.get("speculative_config"))
        if spec is not None and spec.model is not None:  # so is a draft model's
            options["speculative_config"] = replace(spec, model=str(resolve_package(spec.model)))
        self.task = open_package(package_dir, {"provider": provider, **options})  # its kind (ortinf/tasks/kinds.py)
        self.manifest = self.task.manifest
        self.package_dir = Path(package_dir)
        # generate() drives the engine's steps itself: calls from several threads take turns
        self._lock = threading.Lock()

    @property
    def engine(self) -> LLMEngine | None:
        """A text package's LLMEngine (None for the other kinds: Whisper's engine is its transcriber's)."""
        return self.task.engine if isinstance(self.task, TextTask) else None

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        lora: str | Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Generates for every prompt (text or token ids), all batched together; outputs in prompt order.
        `lora`: a loaded LoRA adapter's name (LLM(..., lora_modules={name: folder})) for every prompt, or
        one name (or None: the base model) per prompt; adapters and the base model batch together.

        An invalid request raises RequestError before anything runs. Thread-safe: concurrent calls
        run one after the other (batch the prompts in one call to run them together).
        """
        if not isinstance(self.task, TextTask):
            raise ConfigError(f"this package is a {self.manifest.task} model: use embed(), not generate()")
        with self._lock:
            return self._generate(prompts, sampling_params, use_tqdm, lora)

    def chat(
        self,
        messages: Sequence[dict] | Sequence[Sequence[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict | None = None,
        use_tqdm: bool = False,
        lora: str | Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (OpenAI-style messages) or a list of them, each rendered by the package's
        chat template and generated, all batched together; outputs in conversation order. A vision-language
        package takes `image_url` parts (base64 data URLs, as the server does) where its template puts images.
        An invalid conversation raises RequestError before anything runs."""
        from ortinf.tasks.chat.chat import Chat

        if not isinstance(self.task, TextTask):
            raise ConfigError(f"this package is a {self.manifest.task} model: use embed(), not chat()")
        chat = Chat.load(self.package_dir, self.task.tokenizer, self.manifest.vision)
        if chat.template is None or chat.tokenizer is None:
            raise ConfigError(f"{self.package_dir} has no chat template (or no tokenizer): use generate() for plain continuation")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts: list = []
        for conversation in conversations:
            parsed = chat.parse(conversation)
            ids = chat.prompt(parsed, add_generation_prompt=add_generation_prompt, extra=chat_template_kwargs)
            images = chat.images(parsed)
            prompts.append({"prompt_token_ids": ids, "multi_modal_data": {"image": images}} if images else ids)
        return self.generate(prompts, sampling_params, use_tqdm, lora)

    def _generate(self, prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams | Sequence[SamplingParams] | None,
                  use_tqdm: bool, lora: str | Sequence[str | None] | None) -> list[RequestOutput]:
        batch = _as_batch(prompts)
        params = _params_for(batch, sampling_params)
        loras = [lora] * len(batch) if lora is None or isinstance(lora, str) else list(lora)
        if len(loras) != len(batch):
            raise RequestError(f"{len(loras)} LoRA names for {len(batch)} prompts: pass one name, or one per prompt")
        engine = self.task.engine
        programs: list[Program] = []
        for i, (prompt, p, adapter) in enumerate(zip(batch, params, loras)):  # every request checked before any runs
            prompt, images = _with_images(prompt)
            # one output per sample, when it finishes (no per-step copies); a beam search gives the n best
            programs.append(text.program(engine, text.samples(engine, prompt, p, lora_name=adapter, images=images), str(i)))
        bar = tqdm(total=len(programs), desc="generating", disable=not use_tqdm)
        try:
            driver.run(engine, programs, on_step=lambda: bar.update(sum(p.complete for p in programs) - bar.n))
        finally:
            bar.close()
        return [program.merged(str(i)) for i, program in enumerate(programs)]

    def transcribe(self, audios: np.ndarray | Sequence[np.ndarray], max_new_tokens: int | None = None) -> list[str]:
        """The text of each audio (16 kHz mono float samples) with a Whisper package; greedy, windows of 30 s."""
        if not isinstance(self.task, SpeechTask):
            raise ConfigError(f"this package is a {self.manifest.task} model: transcribe() needs a speech-recognition package")
        batch = [audios] if isinstance(audios, np.ndarray) and audios.ndim == 1 else list(audios)
        with self._lock:
            return self.task.transcriber.transcribe(batch, max_new_tokens)

    def text2text(self, inputs: str | Sequence[str] | Sequence[Sequence[int]],
                  max_new_tokens: int | None = None) -> list[str] | list[list[int]]:
        """A text encoder-decoder's (Marian, BART) greedy output for each input: texts give texts (the
        package's tokenizer), token-id lists give token-id lists; all inputs decode together."""
        if not isinstance(self.task, TextTask) or self.manifest.task != TEXT2TEXT:
            raise ConfigError(f"this package is a {self.manifest.task} model: text2text() needs a text2text-generation package")
        batch = [inputs] if isinstance(inputs, str) else list(inputs)
        texts = [isinstance(item, str) for item in batch]
        if any(texts) and not all(texts):
            raise RequestError("text2text() takes texts or token-id lists, not both in one call", param="prompt")
        if batch and all(texts) and self.task.tokenizer is None:
            raise ConfigError(f"{self.package_dir} has no tokenizer.json (Marian's SentencePiece tokenizer has "
                              "no fast form): pass token ids")
        with self._lock:
            outputs = self._generate(batch, SamplingParams(max_tokens=max_new_tokens, temperature=0.0), False, None)
        if batch and all(texts):
            return [o.outputs[0].text for o in outputs]
        eos = set(self.manifest.eos_token_ids)  # the ids of what was generated, as generate() gives them less the EOS
        return [[t for t in o.outputs[0].token_ids if t not in eos] for o in outputs]

    def embed(self, texts: str | Sequence[str]) -> np.ndarray:
        """Embeddings [len(texts), dim] of a feature-extraction package."""
        if not isinstance(self.task, PoolingTask) or self.manifest.encoder.pooling is None:
            raise ConfigError(f"this package is a {self.manifest.task} model: embed() needs a feature-extraction package")
        pooling = self.task.pooling
        with self._lock:
            return pooling.run(pooling.texts([texts] if isinstance(texts, str) else list(texts)))


def _with_images(prompt: Prompt) -> tuple[str | Sequence[int], list]:
    """(the prompt, its images) of a prompt that may be vLLM's dict form."""
    if not isinstance(prompt, dict):
        return prompt, []
    unknown = set(prompt) - {"prompt", "prompt_token_ids", "multi_modal_data"}
    if unknown or ("prompt" in prompt) == ("prompt_token_ids" in prompt):
        raise RequestError("a dict prompt takes 'prompt' (text) or 'prompt_token_ids', and 'multi_modal_data' ({'image': ...})",
                           param="prompt")
    data = prompt.get("multi_modal_data") or {}
    if set(data) - {"image"}:
        raise RequestError(f"multi_modal_data takes 'image' only, not {', '.join(sorted(set(data) - {'image'}))}", param="prompt")
    images = data.get("image", [])
    return prompt.get("prompt", prompt.get("prompt_token_ids")), list(images) if isinstance(images, (list, tuple)) else [images]


def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, (int, np.integer)) for t in prompts):
        return [prompts]  # one prompt of token ids
    return prompts


def _params_for(batch: list[Prompt], params: SamplingParams | Sequence[SamplingParams] | None) -> list[SamplingParams]:
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * len(batch)
    params = list(params)
    if len(params) != len(batch):
        raise RequestError(f"got {len(params)} SamplingParams for {len(batch)} prompts: pass one, or one per prompt")
    return params

