"""build: an EngineConfig -> the engine's parts (as vLLM v1's EngineCore sets up its executor, KV cache and scheduler).
Which parts a package gets is decided here, once: the provider, the decoder graph and its KV pool, LoRA slots, the KV
cache manager (and its prefix store on disk), the scheduler, grammars, an encoder-decoder's encoder and rules, a
vision model's image encoder, the model runner, a draft model's proposer, and the input processor over them.
LLMEngine (llm_engine.py) only steps what this returns."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from ortinf.config import EngineConfig
from ortinf.errors import ConfigError
from ortinf.manifest import SPEECH_RECOGNITION, TEXT2TEXT, TEXT_GENERATION, Manifest
from ortinf.providers.registry import resolve
from ortinf.runtime.core.kv_cache_manager import KVCacheManager
from ortinf.runtime.core.scheduler import Scheduler, SchedulerConfig
from ortinf.runtime.engine.draft_proposer import DraftProposer
from ortinf.runtime.engine.input_processor import InputProcessor
from ortinf.runtime.sample.decoder_rules import DecoderRules
from ortinf.runtime.sample.structured_output import GrammarCompiler
from ortinf.runtime.sample.whisper_rules import SpeechRules
from ortinf.runtime.worker.cross_encoder import CrossEncoder
from ortinf.runtime.worker.decoder_graph import DecoderGraph, cpu_kernels, pool_spec
from ortinf.runtime.worker.kv_pool import check_context, resolve_num_blocks
from ortinf.runtime.worker.lora import LoraAdapter, LoraSlots
from ortinf.runtime.worker.model_runner import ModelRunner
from ortinf.runtime.worker.prefix_store import open_store
from ortinf.runtime.worker.vision_encoder import VisionEncoder
from ortinf.tokenizer import checked_tokenizer


@dataclass(frozen=True, slots=True)
class EngineParts:
    """What build returns; LLMEngine keeps each under the same name."""

    manifest: Manifest
    tokenizer: Tokenizer | None
    max_model_len: int
    graph: DecoderGraph
    loras: LoraSlots | None
    kv_cache: KVCacheManager
    scheduler: Scheduler
    grammars: GrammarCompiler | None
    runner: ModelRunner
    draft: DraftProposer | None
    inputs: InputProcessor


def build(config: EngineConfig) -> EngineParts:
    """Every part of a generating engine over `config.package_dir`; ConfigError for a package or a setting that
    cannot run."""
    manifest = Manifest.load(config.package_dir)
    if manifest.task not in (TEXT_GENERATION, TEXT2TEXT, SPEECH_RECOGNITION) or manifest.decoder is None:
        raise ConfigError(f"{config.package_dir} holds a {manifest.task} model; generation needs a text-generation, "
                          "text2text-generation or speech-recognition package")
    seq2seq = manifest.seq2seq  # Marian, BART: a request's prompt is the encoder's source (ortinf/runtime/worker/encoder_input.py)
    # Whisper: requests come from ortinf/tasks/speech/transcriber.py, a window's log-mel as their encoder input
    speech = manifest.speech
    encoder_decoder = seq2seq is not None or speech is not None
    if encoder_decoder and (config.speculative_config is not None or config.max_loras):
        raise ConfigError("speculative decoding and LoRA adapters are for text-generation packages, not encoder-decoders")
    spec = manifest.decoder
    tokenizer, vocab = checked_tokenizer(config.package_dir, spec.vocab_size) if manifest.has_tokenizer else (None, None)
    max_model_len = check_context(config, spec)
    # Marian and BART packages have no encoder graph that writes a device pool (Whisper's do): "auto"
    # keeps them on the CPU, where the pool is host memory
    found = resolve("cpu" if seq2seq is not None and config.provider == "auto" else config.provider)
    kernels = cpu_kernels(manifest, config.package_dir, found.provider.name, config.cpu_kernel)
    # an encoder-decoder's request holds cross blocks for its whole encoder input beside its own
    cross_positions = speech.source_positions if speech else seq2seq.max_source_positions if seq2seq else 0
    num_blocks = resolve_num_blocks(config, pool_spec(manifest, kernels), max_model_len, found.provider, cross_positions)
    graph = DecoderGraph(config.package_dir, num_blocks, config.block_size, found, config.intra_op_threads,
                         config.provider_options, config.allow_cpu_fallback, config.shape_buckets, config.cpu_kernel,
                         bf16_math=config.bf16_math)
    loras = lora_slots(config, graph)
    kv_cache = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
    if config.prefix_cache_dir is not None:  # the prefix cache's full blocks kept on disk too
        kv_cache.store = open_store(config, graph, encoder_decoder)
    scheduler_config = SchedulerConfig(config.max_num_seqs, config.max_num_batched_tokens, max_model_len,
                                       graph.max_query_len or 0, config.max_num_encoder_input_tokens,
                                       speculative=config.speculative_config, policy=config.scheduling_policy)
    scheduler = Scheduler(scheduler_config, kv_cache)
    grammars = GrammarCompiler(tokenizer, spec.vocab_size, manifest.eos_token_ids) if tokenizer else None
    encoder = rules = None
    if encoder_decoder:
        encoder = CrossEncoder(config.package_dir, manifest, graph.pool, found, config.intra_op_threads)
    if seq2seq is not None:  # Marian, BART: every request's; Whisper's are chosen by request data (timestamps)
        rules = DecoderRules.load(config.package_dir, spec.vocab_size)
    speech_rules = SpeechRules.load(config.package_dir, spec.vocab_size, manifest.eos_token_ids) if speech is not None else None
    vision = None
    if manifest.vision is not None:  # image embeddings in the graph's type (ortinf/exporter/vision_language.py)
        embeds_type = next(i.type for i in graph.session.get_inputs() if i.name == "image_embeds")
        vision = VisionEncoder(config.package_dir, manifest, found, config.intra_op_threads,
                               np.dtype(np.float16 if "float16" in embeds_type else np.float32), config.cpu_kernel)
    runner = ModelRunner(graph, seed=config.seed, grammars=grammars, encoder=encoder, rules=rules, vision=vision,
                         speech_rules=speech_rules)
    draft = draft_proposer(config, num_blocks, found)
    inputs = InputProcessor(config, manifest, tokenizer, vocab.longest if vocab is not None else 16, max_model_len,
                            graph.max_query_len, grammars, rules, loras)
    return EngineParts(manifest, tokenizer, max_model_len, graph, loras, kv_cache, scheduler, grammars, runner, draft, inputs)


def lora_slots(config: EngineConfig, graph: DecoderGraph) -> LoraSlots | None:
    """The adapters' slots, with --lora-modules loaded; None when no adapter may load."""
    if config.max_loras == 0:
        return None
    slots = LoraSlots(graph.spec, config.max_loras, config.max_lora_rank, graph.lora_dtype)
    for name, path in config.lora_modules.items():
        slots.add(LoraAdapter.load(name, path, graph.spec))
    graph.lora = slots
    return slots


def draft_proposer(config: EngineConfig, num_blocks: int, found) -> DraftProposer | None:  # found: a resolved provider
    """A draft model's proposer (speculative_config's draft_model method); None for n-gram lookup or none."""
    spec = config.speculative_config
    if spec is None or spec.method != "draft_model":
        return None
    return DraftProposer(Path(spec.model), config.package_dir, spec.num_speculative_tokens, num_blocks,
                         config.block_size, found, config.intra_op_threads, config.provider_options,
                         config.bf16_math)
