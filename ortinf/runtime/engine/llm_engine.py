"""LLMEngine: the synchronous engine. One step is three calls: schedule, execute, update."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ortinf.config import EngineConfig
from ortinf.errors import ConfigError, ContextLengthError, RequestError, StepFailedError
from ortinf.manifest import SPEECH_RECOGNITION, TEXT2TEXT, TEXT_GENERATION, Manifest
from ortinf.providers.registry import resolve
from ortinf.runtime.core.kv_cache_manager import KVCacheManager
from ortinf.runtime.core.request import FinishReason, Request
from ortinf.runtime.core.scheduler import Scheduler, SchedulerConfig, check_fits
from ortinf.runtime.core.stopping import Verdict, judge
from ortinf.runtime.engine.draft_proposer import DraftProposer
from ortinf.runtime.engine.output_processor import OutputProcessor
from ortinf.runtime.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from ortinf.runtime.sample.decoder_rules import DecoderRules
from ortinf.runtime.sample.request_options import DEFAULT, RequestOptions
from ortinf.runtime.sample.sampling_params import SamplingParams
from ortinf.runtime.sample.structured_output import GrammarCompiler, one_line
from ortinf.runtime.sample.whisper_rules import SpeechRules
from ortinf.runtime.worker.cross_encoder import CrossEncoder
from ortinf.runtime.worker.decoder_graph import DecoderGraph, cpu_kernels, pool_spec
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage
from ortinf.runtime.worker.kv_pool import check_context, resolve_num_blocks
from ortinf.runtime.worker.lora import LoraAdapter, LoraSlots
from ortinf.runtime.worker.model_runner import ModelRunner
from ortinf.runtime.worker.prefix_store import open_store
from ortinf.runtime.worker.scheduler_output import ModelRunnerOutput, SchedulerOutput
from ortinf.runtime.worker.vision_encoder import VisionEncoder
from ortinf.tokenizer import bad_words_ids, check_unicode, checked_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A tokenised, validated request, ready for add_request."""

    text: str | None
    token_ids: list[int]
    params: SamplingParams
    lora_name: str | None = None  # a loaded LoRA adapter, None for the base model
    encoder_input: EncoderInput | None = None  # an encoder-decoder's (the source; `token_ids` are the decoder's)
    priority: int = 0  # lower runs first under the priority scheduling policy (vLLM's)
    cache_salt: str | None = None  # a client's prefix-cache salt: blocks are shared only under the same salt
    output_token_ids: tuple[int, ...] = ()  # tokens already generated (a beam's, ortinf/tasks/beams.py): computed as the prompt is
    images: tuple[PlacedImage, ...] = ()  # a vision-language request's images and where their placeholders are
    options: RequestOptions = DEFAULT  # what the front-end asks of the engine beside the client's params

    @property
    def num_prompt_tokens(self) -> int:
        """What usage counts as the prompt: the source's tokens for an encoder-decoder, else the prompt's."""
        return self.encoder_input.num_positions if self.encoder_input is not None else len(self.token_ids)


class LLMEngine:
    """Owns the scheduler, the KV cache manager, the model runner and the output processor."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        manifest = Manifest.load(config.package_dir)
        if manifest.task not in (TEXT_GENERATION, TEXT2TEXT, SPEECH_RECOGNITION) or manifest.decoder is None:
            raise ConfigError(f"{config.package_dir} holds a {manifest.task} model; generation needs a text-generation, "
                              "text2text-generation or speech-recognition package")
        self.manifest = manifest
        self.seq2seq = manifest.seq2seq  # Marian, BART: a request's prompt is the encoder's source (ortinf/runtime/worker/encoder_input.py)
        # Whisper: requests come from ortinf/tasks/speech/transcriber.py, a window's log-mel as their encoder input
        self.speech = manifest.speech
        self.encoder_decoder = self.seq2seq is not None or self.speech is not None
        if self.encoder_decoder and (config.speculative_config is not None or config.max_loras):
            raise ConfigError("speculative decoding and LoRA adapters are for text-generation packages, not encoder-decoders")
        spec = manifest.decoder
        self.tokenizer, vocab = checked_tokenizer(config.package_dir, spec.vocab_size) if manifest.has_tokenizer else (None, None)
        self.max_model_len = check_context(config, spec)
        # Marian and BART packages have no encoder graph that writes a device pool (Whisper's do): "auto"
        # keeps them on the CPU, where the pool is host memory
        found = resolve("cpu" if self.seq2seq is not None and config.provider == "auto" else config.provider)
        kernels = cpu_kernels(manifest, config.package_dir, found.provider.name, config.cpu_kernel)
        # an encoder-decoder's request holds cross blocks for its whole encoder input beside its own
        cross_positions = self.speech.source_positions if self.speech else self.seq2seq.max_source_positions if self.seq2seq else 0
        num_blocks = resolve_num_blocks(config, pool_spec(manifest, kernels), self.max_model_len, found.provider, cross_positions)
        self.graph = DecoderGraph(config.package_dir, num_blocks, config.block_size, found, config.intra_op_threads,
                                  config.provider_options, config.allow_cpu_fallback, config.shape_buckets, config.cpu_kernel,
                                  bf16_math=config.bf16_math)
        self.loras = self._lora_slots(config)
        self.kv_cache = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        if config.prefix_cache_dir is not None:  # the prefix cache's full blocks kept on disk too
            self.kv_cache.store = open_store(config, self.graph, self.encoder_decoder)
        scheduler_config = SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len,
                                           self.graph.max_query_len or 0, config.max_num_encoder_input_tokens,
                                           speculative=config.speculative_config, policy=config.scheduling_policy)
        self.scheduler = Scheduler(scheduler_config, self.kv_cache)
        self.grammars = GrammarCompiler(self.tokenizer, spec.vocab_size, manifest.eos_token_ids) if self.tokenizer else None
        encoder = rules = None
        if self.encoder_decoder:
            encoder = CrossEncoder(config.package_dir, manifest, self.graph.pool, found, config.intra_op_threads)
        if self.seq2seq is not None:  # Marian, BART: every request's; Whisper's are chosen by request data (timestamps)
            rules = DecoderRules.load(config.package_dir, spec.vocab_size)
        speech_rules = SpeechRules.load(config.package_dir, spec.vocab_size, manifest.eos_token_ids) if self.speech is not None else None
        vision = None
        if manifest.vision is not None:  # image embeddings in the graph's type (ortinf/exporter/vision_language.py)
            embeds_type = next(i.type for i in self.graph.session.get_inputs() if i.name == "image_embeds")
            vision = VisionEncoder(config.package_dir, manifest, found, config.intra_op_threads,
                                   np.dtype(np.float16 if "float16" in embeds_type else np.float32), config.cpu_kernel)
        self.runner = ModelRunner(self.graph, seed=config.seed, grammars=self.grammars, encoder=encoder, rules=rules, vision=vision,
                                 speech_rules=speech_rules)
        self.draft = self._draft_proposer(config, num_blocks, found)
        self.num_failed_steps_in_a_row = 0
        self._lora_loads = 0
        self._lora_keys = {name: f"{name}#0" for name in self.lora_names()}  # name -> its identity in prefix-cache keys
        self.outputs = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()
        # A text prompt longer than this many characters cannot fit the context in any tokenization:
        # it is refused before the tokenizer spends seconds on megabytes (2x the longest vocabulary
        # entry per token, for normalizers that expand text).
        longest = vocab.longest if vocab is not None else 16
        self.max_prompt_tokens = self.seq2seq.max_source_positions if self.seq2seq is not None else self.max_model_len
        self.max_prompt_chars = self.max_prompt_tokens * 2 * max(longest, 1)

    def wait_until_resident(self) -> None:
        """Returns once the KV pool's memory is mapped (a large pool is mapped in the background: kv_pool.py)."""
        self.graph.pool.wait_until_resident()

    def close(self) -> None:
        """Writes out what the prefix store still has queued (the engine's thread has stopped)."""
        if self.kv_cache.store is not None:
            self.kv_cache.store.close()

    def _lora_slots(self, config: EngineConfig) -> LoraSlots | None:
        """The adapters' slots, with --lora-modules loaded; None when no adapter may load."""
        if config.max_loras == 0:
            return None
        slots = LoraSlots(self.graph.spec, config.max_loras, config.max_lora_rank, self.graph.lora_dtype)
        for name, path in config.lora_modules.items():
            slots.add(LoraAdapter.load(name, path, self.graph.spec))
        self.graph.lora = slots
        return slots

    def add_lora(self, name: str, path: str | Path | LoraAdapter) -> None:
        """Loads a PEFT LoRA folder under `name`, or an adapter already read with LoraAdapter.load (the
        server reads it off the engine thread, which then only writes its slot); ConfigError says
        what is wrong."""
        if self.loras is None:
            raise ConfigError("no LoRA slots: start the engine with max_loras >= 1 (--max-loras) on a package exported with --enable-lora")
        self.loras.add(path if isinstance(path, LoraAdapter) else LoraAdapter.load(name, path, self.graph.spec))
        self._lora_loads += 1
        self._lora_keys[name] = f"{name}#{self._lora_loads}"

    def remove_lora(self, name: str) -> None:
        """Unloads an adapter; refused while a request uses it."""
        if self.loras is None or name not in self.loras.adapters:
            raise ConfigError(f"no LoRA adapter named '{name}' is loaded")
        users = [r.request_id for r in self.scheduler.requests.values() if r.lora_key == self._lora_keys.get(name) and not r.is_finished]
        if users:
            raise ConfigError(f"LoRA '{name}' is in use by {len(users)} request(s): unload it once they finish")
        self.loras.remove(name)
        self._lora_keys.pop(name, None)

    def lora_names(self) -> list[str]:
        return list(self.loras.adapters) if self.loras is not None else []

    @staticmethod
    def _draft_proposer(config: EngineConfig, num_blocks: int, found) -> DraftProposer | None:
        spec = config.speculative_config
        if spec is None or spec.method != "draft_model":
            return None
        return DraftProposer(Path(spec.model), config.package_dir, spec.num_speculative_tokens, num_blocks,
                             config.block_size, found, config.intra_op_threads, config.provider_options,
                             config.bf16_math)

    def _draft_proposals(self) -> dict[str, list[int]]:
        """The draft model's proposals for this step's decoding requests; none when it fails (the
        step then runs without speculation: the target's output never depends on the draft)."""
        candidates = self.scheduler.speculation_candidates()
        if not candidates:
            return {}
        try:
            return self.draft.propose([(r.request_id, r.all_token_ids, limit) for r, limit in candidates])
        except Exception as exc:  # noqa: BLE001
            log.warning("the draft model failed (%s: %s): this step runs without proposals", type(exc).__name__, exc)
            return {}

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
        step = min(self.config.max_num_batched_tokens, self.graph.max_query_len or self.config.max_num_batched_tokens)
        ids, placed = place_images(list(prepared.token_ids), images, vision, step)
        params = prepared.params
        if len(ids) >= self.max_model_len:
            raise ContextLengthError(f"the prompt has {len(ids)} tokens with its images; the context length is {self.max_model_len}",
                                     len(ids), None, self.max_model_len, param="prompt")
        if params.max_tokens is not None and len(ids) + params.max_tokens > self.max_model_len:
            params = replace(params, max_tokens=self.max_model_len - len(ids))
        check_fits(len(ids), params.max_tokens, self.max_model_len)
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
        if params.max_tokens is None:  # as many as the context length leaves
            if len(token_ids) >= self.max_model_len:
                raise ContextLengthError(f"the prompt has {len(token_ids)} tokens; the context length is {self.max_model_len}",
                                         len(token_ids), None, self.max_model_len, param="prompt")
            params = replace(params, max_tokens=self.max_model_len - len(token_ids))
        check_fits(len(token_ids), params.max_tokens, self.max_model_len)
        return PreparedRequest(text, token_ids, params, lora_name, options=options)

    def _prepare_source(self, prompt: str | Sequence[int], params: SamplingParams) -> PreparedRequest:
        """An encoder-decoder's request: the prompt is the encoder's source; the decoder starts from its
        start token."""
        if params.prompt_logprobs is not None or params.truncate_prompt_tokens is not None:
            raise RequestError("echo, prompt_logprobs and truncate_prompt_tokens are for text-generation models: a "
                               "text2text-generation model's prompt is its encoder's source", param="prompt_logprobs")
        rules = self.runner.rules
        if params.structured_output is not None and rules is not None and (rules.forced_bos is not None or rules.forced_eos is not None):
            raise RequestError("this model's generation config forces its first and last tokens (forced_bos_token_id, "
                               "forced_eos_token_id), which a grammar would reject: remove response_format / the structured "
                               "output for this model", param=params.structured_output.param)
        text, source = self.tokenize(prompt)
        limit = self.seq2seq.max_source_positions
        if not 0 < len(source) <= limit:
            raise RequestError(f"a source must hold 1 to {limit} tokens, not {len(source)}", param="prompt")
        token_ids = [self.seq2seq.decoder_start_token_id]
        if params.max_tokens is None:
            params = replace(params, max_tokens=self.max_model_len - 1)
        if params.max_tokens < 1:
            raise RequestError("max_tokens must be at least 1 for text2text-generation models", param="max_tokens")
        check_fits(1, params.max_tokens, self.max_model_len)
        return PreparedRequest(text, token_ids, params, None, EncoderInput.of(np.asarray(source, dtype=np.int64), len(source), "source"))

    def add_request(self, prompt: str | Sequence[int] | PreparedRequest, params: SamplingParams | None = None, request_id: str | None = None,
                    lora_name: str | None = None) -> str:
        """Queues a request; raises RequestError (nothing queued) when it is invalid."""
        prepared = prompt if isinstance(prompt, PreparedRequest) else self.prepare(prompt, params, lora_name)
        if prepared.lora_name is not None and prepared.lora_name not in self._lora_keys:  # unloaded since prepare()
            raise RequestError(f"no LoRA adapter named '{prepared.lora_name}' is loaded", param="model")
        if prepared.options.whisper_timestamps is not None and self.speech is None:
            raise RequestError("Whisper's decoding rules are for speech-recognition packages", param="prompt")
        request = Request(
            request_id=request_id if request_id is not None else str(next(self._ids)),
            prompt_token_ids=prepared.token_ids,
            sampling_params=prepared.params,
            eos_token_ids=self.manifest.eos_token_ids,
            arrival_time=time.monotonic(),
            lora_slot=self.loras.slot(prepared.lora_name) if self.loras is not None else -1,
            lora_key=self._lora_keys.get(prepared.lora_name) if prepared.lora_name is not None else None,
            encoder_input=prepared.encoder_input,
            priority=prepared.priority,
            salt=prepared.cache_salt,
            images=prepared.images,
            options=prepared.options,
        )
        for token in prepared.output_token_ids:  # a beam's tokens so far: the rules (min_tokens, forced EOS) count them
            request.append_output_token(token)
        self.scheduler.add_request(request)
        self.outputs.add_request(request, prepared.text)
        return request.request_id

    def step(self) -> list[RequestOutput]:
        """Runs one engine step; returns outputs of the requests that advanced or finished.

        Failure isolation: an exception while scheduling, running or sampling fails only the
        requests it can be blamed on (a finished output carrying `error`; their blocks are freed)
        and the engine stays usable. `num_failed_steps_in_a_row` lets the caller decide when
        failures are no longer explained by requests (see AsyncEngine).
        """
        if self.draft is not None:
            self.scheduler.proposals = self._draft_proposals()
        try:
            scheduler_output = self.scheduler.schedule()
        except Exception as exc:  # noqa: BLE001 - nothing was scheduled: every unfinished request is a suspect
            return self._fail_step([r.request_id for r in (*self.scheduler.running, *self.scheduler.waiting)], exc, "scheduling")
        if self.draft is not None:
            self.draft.release(scheduler_output.finished_request_ids)
        results: list[RequestOutput] = []
        try:
            try:
                runner_output = self.runner.execute(scheduler_output)
            except Exception as exc:  # noqa: BLE001 - find the requests at fault, keep the others
                scheduler_output, runner_output, results = self._execute_one_by_one(scheduler_output, exc)
            verdicts, misjudged = self._judge(scheduler_output, runner_output)
            changed = self.scheduler.update_from_output(scheduler_output, runner_output, verdicts)
            self.outputs.record_prompt_logprobs(runner_output)
        except Exception as exc:  # noqa: BLE001 - the step's requests end; the engine goes on
            return results + self._fail_step([s.request_id for s in scheduler_output.scheduled], exc, "running")
        for request_id, reason in runner_output.cannot_continue.items():
            results += self._fail_requests([request_id], RequestError(f"the output cannot continue: {one_line(reason)}"), "sampling")
        for request_id, exc in misjudged.items():
            results += self._fail_requests([request_id], exc, "detokenizing")
        now = time.monotonic()
        for request in changed:
            try:
                self.outputs.record_step(request, runner_output, now)
                output = self._emit(request)
                if output is not None:  # None: a final_only request that has not finished
                    results.append(output)
            except Exception as exc:  # noqa: BLE001 - one request's output must not fail the others
                results += self._fail_requests([request.request_id], exc, "detokenizing")
        self.num_failed_steps_in_a_row = 0
        return results

    def _execute_one_by_one(self, scheduler_output: SchedulerOutput,
                            exc: Exception) -> tuple[SchedulerOutput, ModelRunnerOutput, list[RequestOutput]]:
        """After a failed step: runs each request of the step alone, so that only the ones that fail
        alone are failed. Re-running is safe: nothing was committed (the K/V of the same slots is
        written again, the scheduler has not advanced, and the model runner put back the random
        generators and grammar matchers its sampling had advanced before the failure). When every
        request fails, the step counts as failed (see `num_failed_steps_in_a_row`)."""
        scheduled = scheduler_output.scheduled
        merged = ModelRunnerOutput()
        kept, failed = [], []
        for item in scheduled if len(scheduled) > 1 else ():
            try:
                output = self.runner.execute(replace(scheduler_output, scheduled=(item,), finished_request_ids=frozenset()))
            except Exception as alone:  # noqa: BLE001
                failed.append((item.request_id, alone))
                continue
            kept.append(item)
            merged.sampled_token_ids.update(output.sampled_token_ids)
            merged.logprobs.update(output.logprobs)
            merged.prompt_logprobs.update(output.prompt_logprobs)
            merged.format_complete.update(output.format_complete)
            merged.cannot_continue.update(output.cannot_continue)
            merged.candidates.update(output.candidates)
            merged.watched.update(output.watched)
        if not kept:  # nothing ran: the step failed as a whole
            raise exc
        results = []
        for request_id, alone in failed:
            results += self._fail_requests([request_id], alone, "running")
        return replace(scheduler_output, scheduled=tuple(kept)), merged, results

    def _judge(self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput) -> tuple[dict, dict[str, Exception]]:
        """Each sampled request's verdict (ortinf/runtime/core/stopping.py: the one place that decides that a
        request has finished), and the requests whose judging failed (they fail alone)."""
        verdicts, failed = {}, {}
        for scheduled in scheduler_output.scheduled:
            request_id = scheduled.request_id
            request = self.scheduler.requests.get(request_id)
            if not scheduled.sample or request is None or request.is_finished or request_id in runner_output.cannot_continue:
                continue
            try:
                verdict = judge(request, runner_output.sampled_token_ids.get(request_id, []), self.outputs.detokenizer(request_id),
                                self.max_model_len, request_id in runner_output.format_complete)
                verdicts[request_id] = self._forced_eos_is_length(request, verdict)
            except Exception as exc:  # noqa: BLE001
                failed[request_id] = exc
        return verdicts, failed

    def _forced_eos_is_length(self, request: Request, verdict: Verdict) -> Verdict:
        """An encoder-decoder whose generation config forces EOS as the last token the length allows
        (BART, Marian) ended for its length, not by choice: finish_reason "length", as OpenAI says when
        max_tokens cut the output."""
        rules, max_tokens = self.runner.rules, request.sampling_params.max_tokens
        if (rules is None or rules.forced_eos is None or verdict.finish_reason is not FinishReason.STOP or verdict.stop_reason is not None
                or max_tokens is None or request.num_output_tokens + verdict.keep < max_tokens):
            return verdict
        return Verdict(verdict.keep, FinishReason.LENGTH)

    def _fail_step(self, request_ids: list[str], exc: Exception, stage: str) -> list[RequestOutput]:
        self.num_failed_steps_in_a_row += 1
        return self._fail_requests(request_ids, exc, stage)

    def _fail_requests(self, request_ids: list[str], exc: Exception, stage: str) -> list[RequestOutput]:
        """Ends the requests with an error output each and frees their blocks."""
        log.error("engine step failed while %s requests %s: %s: %s", stage, ", ".join(request_ids[:8]), type(exc).__name__, exc,
                  exc_info=exc)
        error = exc if isinstance(exc, RequestError) else StepFailedError(
            f"the engine failed while {stage} this request ({type(exc).__name__}: {str(exc)[:200]}); other requests are unaffected", exc)
        results = []
        for request_id in request_ids:
            request = self.scheduler.requests.get(request_id)
            if request is None:
                continue
            self.scheduler.finish_request(request_id, FinishReason.ABORT)
            self.outputs.remove(request_id)
            self.scheduler.release(request_id)
            if self.draft is not None:
                self.draft.release([request_id])
            completion = CompletionOutput(0, "", list(request.output_token_ids), FinishReason.ABORT.value)
            results.append(RequestOutput(request_id, None, request.prompt_token_ids, [completion], finished=True, error=error,
                                         num_output_tokens=request.num_output_tokens))
        return results

    def abort(self, request_id: str) -> RequestOutput | None:
        """Ends a request now and frees its KV blocks; returns its last output."""
        request = self.scheduler.requests.get(request_id)
        if request is None:
            return None
        self.scheduler.finish_request(request_id, FinishReason.ABORT)
        return self._emit(request)

    def _emit(self, request: Request) -> RequestOutput | None:
        output = self.outputs.make_output(request)
        if request.is_finished:
            self.outputs.remove(request.request_id)
            self.scheduler.release(request.request_id)
            if self.draft is not None:
                self.draft.release([request.request_id])
        return output

    def stats(self) -> EngineStats:
        """The engine now, as data (the metrics' only source)."""
        scheduler, kv, spec = self.scheduler, self.kv_cache, self.scheduler.spec_stats
        disk = kv.store.stats() if kv.store is not None else (0, 0, 0, 0)
        return EngineStats(len(scheduler.running), len(scheduler.waiting), kv.usage(), kv.stats.num_queries, kv.stats.num_hits,
                           scheduler.stats.num_preemptions, spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens,
                           tuple(spec.accepted_per_position), *disk)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def check_invariants(self) -> None:
        """Pool invariants plus: every running request owns the blocks its computed tokens need."""
        self.kv_cache.check_invariants()
        for request in self.scheduler.running:
            blocks = self.kv_cache.req_to_blocks.get(request.request_id, [])
            assert len(blocks) * self.config.block_size >= request.num_computed_tokens, request.request_id
