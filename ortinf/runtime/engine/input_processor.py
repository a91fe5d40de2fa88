"""InputProcessor: a client's prompt and params -> a PreparedRequest (vLLM v1's InputProcessor). Tokenising, the
checks of every value against the package (vocabulary, LoRA names, grammars, bad words), images placed in the prompt,
an encoder-decoder's source, and `fit`: the one max_tokens rule and the one "does the prompt fit" check. It reads
engine state but never writes it, so it runs on any thread (the server prepares off its event loop and off the engine's
thread: async_engine.py); LLMEngine.prepare and .tokenize call it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from tokenizers import Tokenizer

from ortinf.config import EngineConfig
from ortinf.errors import ContextLengthError, RequestError
from ortinf.manifest import Manifest
from ortinf.runtime.core.scheduler import check_fits
from ortinf.runtime.engine.prepared import PreparedRequest
from ortinf.runtime.sample.decoder_rules import DecoderRules
from ortinf.runtime.sample.request_options import DEFAULT, RequestOptions
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.sample.structured_output import GrammarCompiler
from ortinf.runtime.worker.encoder_input import EncoderInput
from ortinf.runtime.worker.lora import LoraSlots
from ortinf.tokenizer import bad_words_ids, check_unicode


def fit(params: SamplingParams, num_prompt_tokens: int, max_model_len: int, images: bool = False) -> SamplingParams:
    """`params` with their max_tokens for a prompt of `num_prompt_tokens`, or ContextLengthError: the one max_tokens
    rule and the one "does the prompt fit" check of every prepared request (text, an encoder-decoder's decoder start,
    a prompt with its images' tokens). None is as many tokens as the context leaves (vLLM's default); after images are
    placed, max_tokens is also cut to that, since the client cannot count the tokens its images become (an image prompt
    is fitted as sent, then again with them). check_fits is the scheduler's own check, also run at add_request for
    requests built without prepare (Whisper's windows)."""
    left = max_model_len - num_prompt_tokens
    if left <= 0 and (params.max_tokens is None or images):
        with_images = " with its images" if images else ""
        raise ContextLengthError(f"the prompt has {num_prompt_tokens} tokens{with_images}; the context length is {max_model_len}",
                                 num_prompt_tokens, None, max_model_len, param="prompt")
    if params.max_tokens is None or (images and params.max_tokens > left):
        params = replace(params, max_tokens=left)
    check_fits(num_prompt_tokens, params.max_tokens, max_model_len)
    return params


class InputProcessor:
    """What a request needs checked and computed before the engine sees it; built by engine_builder.py."""

    def __init__(self, config: EngineConfig, manifest: Manifest, tokenizer: Tokenizer | None, longest_token: int, max_model_len: int,
                 max_query_len: int | None, grammars: GrammarCompiler | None, rules: DecoderRules | None, loras: LoraSlots | None) -> None:
        self.config = config
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.grammars = grammars
        self.rules = rules  # Marian's and BART's, which the model runner applies: a grammar they contradict is refused here
        self.loras = loras  # read, never written: adapters load and unload on the engine (LLMEngine.add_lora)
        self.seq2seq, self.speech = manifest.seq2seq, manifest.speech
        # an image's tokens are placed in chunks of at most one step's (ortinf/runtime/worker/image_prompt.py)
        self.image_step = min(config.max_num_batched_tokens, max_query_len or config.max_num_batched_tokens)
        # A text prompt longer than this many characters cannot fit the context in any tokenization:
        # it is refused before the tokenizer spends seconds on megabytes (2x the longest vocabulary
        # entry per token, for normalizers that expand text).
        self.max_prompt_tokens = self.seq2seq.max_source_positions if self.seq2seq is not None else max_model_len
        self.max_prompt_chars = self.max_prompt_tokens * 2 * max(longest_token, 1)

    def lora_names(self) -> list[str]:
        return list(self.loras.adapters) if self.loras is not None else []

    def tokenize(self, prompt: str | Sequence[int], add_special_tokens: bool = True) -> tuple[str | None, list[int]]:
        """(prompt text or None, token ids); every id is checked against the graph's vocabulary."""
        vocab = self.manifest.decoder.vocab_size
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this package has no tokenizer: pass token ids instead of text")
            # the tokenizer's ids were checked against the vocabulary at load (load_checked_tokenizer)
            return prompt, self.tokenizer.encode(check_unicode(prompt, "prompt"), add_special_tokens=add_special_tokens).ids
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in prompt):
            raise RequestError("a token-id prompt must hold integers", param="prompt")
        ids = [int(t) for t in prompt]
        bad = next((t for t in ids if t < 0 or t >= vocab), None)
        if bad is not None:
            raise RequestError(f"token id {bad} is out of range: token ids must be in [0, {vocab})", param="prompt")
        return None, ids

    def prepare(self, prompt: str | Sequence[int], params: SamplingParams | None = None, lora_name: str | None = None, *,
                add_special_tokens: bool = True, priority: int = 0, cache_salt: str | None = None,
                images: Sequence[object] = (), output_kind: str = "cumulative") -> PreparedRequest:
        """Tokenises and validates a request without touching engine state (safe from any thread).
        `lora_name`: a loaded LoRA adapter to run the request with (None: the base model);
        `priority`: lower runs first (only under the priority scheduling policy; 0 otherwise);
        `cache_salt`: prefix-cache blocks are shared only between requests with the same salt;
        `images` (a vision-language package's: PIL images, encoded bytes, paths or uint8 arrays): one per image
        placeholder token of the prompt, which becomes the image's tokens (ortinf/runtime/worker/images.py);
        `output_kind`: what each of its outputs holds (RequestOptions)."""
        if priority and self.config.scheduling_policy != "priority":
            raise RequestError("priority needs the priority scheduling policy: serve with --scheduling-policy priority "
                               "(or send priority 0)", param="priority")
        options = RequestOptions(output_kind=output_kind) if output_kind != DEFAULT.output_kind else DEFAULT
        prepared = self._prepare(prompt, params or SamplingParams(), lora_name, add_special_tokens, options)
        if images or (self.manifest.vision is not None and self.manifest.vision.image_token_id in prepared.token_ids):
            prepared = self._place_images(prepared, list(images))
        return replace(prepared, priority=priority, cache_salt=cache_salt) if priority or cache_salt else prepared

    def _place_images(self, prepared: PreparedRequest, images: list[object]) -> PreparedRequest:
        """Each image preprocessed, and the prompt's placeholders for it expanded to its tokens (or found expanded)."""
        from ortinf.runtime.worker.image_prompt import place_images

        vision = self.manifest.vision
        if vision is None:
            raise RequestError(f"{self.manifest.architecture} reads text: send the prompt without images", param="images")
        ids, placed = place_images(list(prepared.token_ids), images, vision, self.image_step)
        params = fit(prepared.params, len(ids), self.max_model_len, images=True)
        return replace(prepared, token_ids=ids, params=params, images=placed, text=None)

    def _prepare(self, prompt: str | Sequence[int], params: SamplingParams, lora_name: str | None, add_special_tokens: bool,
                 options: RequestOptions) -> PreparedRequest:
        if lora_name is not None and lora_name not in self.lora_names():
            loaded = ", ".join(self.lora_names()) or "none"
            raise RequestError(f"no LoRA adapter named '{lora_name}' is loaded (loaded: {loaded})", param="model")
        vocab = self.manifest.decoder.vocab_size
        bad = next((t for t in params.token_ids_to_check if t >= vocab), None)
        if bad is not None:
            param = "stop_token_ids" if bad in params.stop_token_ids else "logit_bias, allowed_token_ids or bad_words"
            raise RequestError(f"token id {bad} is out of range: token ids must be in [0, {vocab})", param=param)
        if params.structured_output is not None:
            if self.grammars is None:
                raise RequestError("structured output needs the package's tokenizer", param=params.structured_output.param)
            self.grammars.compile(params.structured_output)  # compiled (or found cached) here, off the engine loop
        if params.bad_words:
            options = replace(options, bad_words_ids=bad_words_ids(self.tokenizer, params.bad_words))
        if isinstance(prompt, str) and params.truncate_prompt_tokens is None and len(prompt) > self.max_prompt_chars:
            if self.seq2seq is not None:
                raise RequestError(f"a source must hold 1 to {self.max_prompt_tokens} tokens: {len(prompt)} characters are more "
                                   "than that many tokens can hold", param="prompt")
            raise ContextLengthError(f"the prompt has {len(prompt)} characters, more than {self.max_model_len} tokens (the context "
                                     f"length) can hold: shorten it, or pass truncate_prompt_tokens", None, None, self.max_model_len,
                                     param="prompt")
        if self.speech is not None:
            raise RequestError("a speech-recognition model takes audio: transcribe it (LLM.transcribe, ortinf transcribe, "
                               "/v1/audio/transcriptions)", param="prompt")
        if self.seq2seq is not None:
            return replace(self._prepare_source(prompt, params), options=options)
        text, token_ids = self.tokenize(prompt, add_special_tokens)
        if params.truncate_prompt_tokens is not None and len(token_ids) > params.truncate_prompt_tokens:
            text, token_ids = None, token_ids[-params.truncate_prompt_tokens:]  # the prompt's end is what the model continues
        return PreparedRequest(text, token_ids, fit(params, len(token_ids), self.max_model_len), lora_name, options=options)

    def _prepare_source(self, prompt: str | Sequence[int], params: SamplingParams) -> PreparedRequest:
        """An encoder-decoder's request: the prompt is the encoder's source; the decoder starts from its
        start token."""
        if params.prompt_logprobs is not None or params.truncate_prompt_tokens is not None:
            raise RequestError("echo, prompt_logprobs and truncate_prompt_tokens are for text-generation models: a "
                               "text2text-generation model's prompt is its encoder's source", param="prompt_logprobs")
        rules = self.rules
        if params.structured_output is not None and rules is not None and (rules.forced_bos is not None or rules.forced_eos is not None):
            raise RequestError("this model's generation config forces its first and last tokens (forced_bos_token_id, "
                               "forced_eos_token_id), which a grammar would reject: remove response_format / the structured "
                               "output for this model", param=params.structured_output.param)
        text, source = self.tokenize(prompt)
        limit = self.seq2seq.max_source_positions
        if not 0 < len(source) <= limit:
            raise RequestError(f"a source must hold 1 to {limit} tokens, not {len(source)}", param="prompt")
        if params.max_tokens is not None and params.max_tokens < 1:
            raise RequestError("max_tokens must be at least 1 for text2text-generation models", param="max_tokens")
        token_ids = [self.seq2seq.decoder_start_token_id]  # the decoder's prompt: its start token
        return PreparedRequest(text, token_ids, fit(params, len(token_ids), self.max_model_len), None,
                               EncoderInput.of(np.asarray(source, dtype=np.int64), len(source), "source"))
