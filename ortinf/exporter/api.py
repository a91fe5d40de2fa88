"""`export()`: a Hugging Face model folder in, a verified ortinf package folder out.

    plan (options for this model) -> open (tokenizer, reference) -> trace -> write (rebind, quantize, place the weights)
    -> manifest -> verify -> rename, over one ExportConfig (ortinf/exporter/config.py)
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ortinf.errors import ExportError
from ortinf.exporter import attention_cpu as cpu_paged
from ortinf.exporter import cpu_fusion, streaming
from ortinf.exporter.architectures import resolve_task
from ortinf.exporter.bf16 import CPU_OP as BF16_OP
from ortinf.exporter.bf16 import to_bf16
from ortinf.exporter.config import QUANTIZED, ExportConfig
from ortinf.exporter.decoder import CPU_PAGED, decoder_spec, trace_decoder
from ortinf.exporter.encoder import TracedEncoder, encoder_inputs, encoder_spec, read_pooling, trace_encoder
from ortinf.exporter.kv_write import place_decoder
from ortinf.exporter.package import staging, token_ids, versions, write_generation_config, write_tokenizer
from ortinf.exporter.quantize import BITS, CPU_OP, MOE_OP, quantize
from ortinf.exporter.source import ModelSource, resolve_model
from ortinf.exporter.verify import gate, verify_encoder, verify_package
from ortinf.manifest import (
    CONTRIB_PAGED,
    CPU_MODEL_NAME,
    IMAGE_TEXT_TO_TEXT,
    MANIFEST_NAME,
    MODEL_NAME,
    PORTABLE,
    SPEECH_RECOGNITION,
    TEXT2TEXT,
    TEXT_GENERATION,
    CpuKernel,
    Manifest,
    Quantization,
    is_gguf,
)

log = logging.getLogger(__name__)

# Quantized dtypes trace at fp32, then their MatMul weights become MatMulNBits in model.onnx and
# ortinf.QMatMul in model.cpu.onnx (ortinf/exporter/quantize.py).
# bf16: traced in fp32, its MatMul weights and embeddings then stored in bf16 (ortinf/exporter/bf16.py)
DTYPES = {"fp32": torch.float32, "bf16": torch.float32, "fp16": torch.float16, "int8": torch.float32, "int4": torch.float32}
# Quantized packages are gated by quality figures (verify.py's verify_quality), not by a logit tolerance.
# bf16: a bf16 checkpoint measures as fp32 does (the same weights, fp32 arithmetic); 5e-2 leaves room for a
# wider checkpoint rounded to bf16
DEFAULT_TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2, "fp16": 5e-2, "int8": float("inf"), "int4": float("inf")}
STAGES = ("loading", "tracing", "saving", "verifying")


@dataclass(slots=True)
class Plan:
    """What the options come to for this model: its task, the pool's dtypes, the tolerance, the block size."""

    source: ModelSource
    task: str
    config: ExportConfig
    kv_dtype: str  # model.onnx's pool
    cpu_kv_dtype: str  # model.cpu.onnx's pool where it differs ("int8"), else ""
    tolerance: float
    quant_block_size: int

    @property
    def dtype(self) -> str:
        return self.config.dtype or "fp32"

    @property
    def quantization(self) -> Quantization | None:
        if self.dtype not in QUANTIZED:
            return None
        return Quantization(BITS[self.dtype], self.quant_block_size, self.config.accuracy_level)


@dataclass(slots=True)
class Built:
    """What the stages made in the staging folder: the reference model, the graphs' I/O and the manifest's kind."""

    reference: torch.nn.Module
    has_tokenizer: bool
    has_template: bool
    kind: dict = field(default_factory=dict)  # {"decoder": DecoderSpec} or {"encoder": EncoderSpec}, + quantization
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    cpu_graph: bool = False  # model.cpu.onnx written
    encoder: TracedEncoder | None = None


def export(model: str | os.PathLike[str], out: str | os.PathLike[str], config: ExportConfig | None = None, **options) -> Manifest:
    """Exports MODEL (a local folder, a cached hub id or a GGUF file) to the package folder OUT and verifies it.

    The options are ExportConfig's fields (ortinf/exporter/config.py), given as `config`, as keywords, or both (the
    keywords win). MODEL may be a GGUF file (llama.cpp's, Ollama's): it is read into a temporary Hugging Face folder
    first (ortinf/exporter/gguf_source.py); `dtype` None exports it at the file's own precision (Q8_0 and Q4_0: int8 /
    int4 with the file's values exactly). `dtype` None is fp32 for a folder.

    A decoder or encoder goes through the stages below: open the source (tokenizer, reference model), trace (the
    streamed trace rebinds each layer's weights, ortinf/exporter/rebind.py), write (quantize or round, place both
    graphs' weights in model.onnx.data), manifest, verify. Whisper, seq2seq and vision-language models have exporters
    of their own, on the same config (the vision-language one runs this export for its language model).

    Raises ExportError (or a subclass) with a message that says what to change.
    """
    config = ExportConfig.of(config, **options).check()
    if is_gguf(Path(model).expanduser()):
        return _export_gguf(Path(model).expanduser().resolve(), out, config)
    out_path = Path(out).expanduser().resolve()
    plan = _plan(resolve_model(str(model)), config)
    family = _family_exporter(plan)
    if family is not None:
        return family(out_path)
    bar = tqdm(total=len(STAGES), desc=STAGES[0], disable=not config.progress, bar_format="{desc:<10} {bar} {n}/{total} [{elapsed}]")
    with staging(out_path, config.overwrite) as stage, bar:
        built, skeleton = _open(plan, stage)
        _next(bar)
        _trace_and_write(plan, built, skeleton, stage, bar)
        manifest = _manifest(plan, built, stage)
        _next(bar)
        manifest = _verify(plan, built, manifest, stage)
        bar.update()
    log.info("exported %s to %s (max abs diff %.3g)", plan.source.name, out_path, manifest.parity.max_abs_diff)
    return manifest


def _export_gguf(path: Path, out: str | os.PathLike[str], config: ExportConfig) -> Manifest:
    import tempfile

    from ortinf.exporter.gguf_source import file_quantization, gguf_to_folder, without_vocab_hole_warnings

    if config.dtype is None:
        found = file_quantization(path)
        config = replace(config, dtype=found.dtype, quant_block_size=config.quant_block_size or found.block_size)
        log.warning("%s: %s (pass --dtype to choose)", path.name, found.describe())
    with tempfile.TemporaryDirectory(prefix="ortinf-gguf-") as folder, without_vocab_hole_warnings():
        manifest = export(gguf_to_folder(path, Path(folder)), out, config)
    manifest = replace(manifest, source=str(path))  # the file, not the temporary folder it went through
    (Path(out).expanduser() / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
    return manifest


def _next(bar: tqdm) -> None:
    bar.update()
    bar.set_description_str(STAGES[min(bar.n, len(STAGES) - 1)])


def _plan(source: ModelSource, config: ExportConfig) -> Plan:
    """The model's task and what the options mean for it; refuses an option the model cannot take."""
    config = replace(config, dtype=config.dtype or "fp32")
    dtype, kernel = config.dtype, config.kernel
    task = resolve_task(source.model_type, source.config.get("architectures"), config.task)
    cpu_kv_dtype = "int8" if config.kv_dtype == "int8" else ""
    kv_dtype = kv_cache_dtype(dtype, "auto" if cpu_kv_dtype else config.kv_dtype, kernel)
    tolerance = DEFAULT_TOLERANCE[kv_dtype if dtype == "fp32" else dtype] if config.tolerance is None else config.tolerance
    if config.vision_dtype != "fp32" and task != IMAGE_TEXT_TO_TEXT:
        raise ExportError(f"--vision-dtype is for vision-language models; {source.name} is a {task} model: drop it")
    if task in (SPEECH_RECOGNITION, TEXT2TEXT) and config.kv_dtype != "auto":
        raise ExportError(f"--kv-dtype is for decoder-only models; {source.name} is a {task} model (its KV cache is fp32)")
    if task == SPEECH_RECOGNITION and (dtype not in ("fp32", *QUANTIZED) or kernel != PORTABLE or config.enable_lora):
        raise ExportError(f"{source.name} is a speech model: export it at --dtype fp32, int8 or int4 with the portable kernel "
                          "(fp16, LoRA and the paged-attention kernel are not built for Whisper)")
    if task == IMAGE_TEXT_TO_TEXT and dtype == "bf16":
        raise ExportError(f"--dtype bf16 is for text decoders so far; {source.name} is a vision-language model: "
                          "export it at fp32, int8 or int4")
    if task == IMAGE_TEXT_TO_TEXT and config.enable_lora:
        raise ExportError(f"--enable-lora is for text decoders; {source.name} is a vision-language model")
    if task == TEXT2TEXT and (dtype != "fp32" or kernel != PORTABLE or config.enable_lora):
        raise ExportError(f"{source.name} is a text encoder-decoder: export it at --dtype fp32 with the portable kernel")
    if task not in (TEXT_GENERATION, SPEECH_RECOGNITION, TEXT2TEXT, IMAGE_TEXT_TO_TEXT):
        read_pooling(source)  # refuse unsupported sentence-transformers modules before loading weights
        if dtype in (*QUANTIZED, "bf16"):
            raise ExportError(f"--dtype {dtype} is for decoders; {source.name} is a {task} model: export it at fp32 or fp16")
        if kernel != PORTABLE:
            raise ExportError(f"--kernel {kernel} is for decoders; {source.name} is a {task} model")
        if kv_dtype != dtype or cpu_kv_dtype:
            raise ExportError(f"--kv-dtype is for decoders; {source.name} is a {task} model")
        if config.enable_lora:
            raise ExportError(f"--enable-lora is for decoders; {source.name} is a {task} model")
    elif task == TEXT_GENERATION and kernel == CONTRIB_PAGED:
        check_contrib_paged(source.config)
    if kernel == CONTRIB_PAGED and dtype not in contrib_dtypes():
        raise ExportError(f"the {kernel} kernel runs at {', '.join(contrib_dtypes())} only: pass --dtype fp16")
    return Plan(source, task, config, kv_dtype, cpu_kv_dtype, tolerance, config.block_size)


def _family_exporter(plan: Plan):  # a callable out_path -> Manifest, or None
    """The exporter of a model kind with graphs of its own (speech, text-to-text, vision-language), or None."""
    source, config = plan.source, replace(plan.config, quant_block_size=plan.quant_block_size)
    if plan.task == SPEECH_RECOGNITION:
        from ortinf.exporter.whisper import export_whisper

        return lambda out_path: export_whisper(source, out_path, config, plan.tolerance)
    if plan.task == TEXT2TEXT:
        from ortinf.exporter.seq2seq import export_seq2seq

        return lambda out_path: export_seq2seq(source, out_path, config, plan.tolerance)
    if plan.task == IMAGE_TEXT_TO_TEXT:
        from ortinf.exporter.vision_language import export_vision_language

        return lambda out_path: export_vision_language(source, out_path, export, plan.config)
    return None


def _open(plan: Plan, stage: Path) -> tuple[Built, streaming.Skeleton | None]:
    """Stage 1, open the source: the tokenizer (one that does not fit the vocabulary is refused before the slow part),
    then the reference model: streamed (the weights stay in the checkpoint, one module's loaded at a time) where the
    streaming exporter covers the model, else loaded whole."""
    source, config = plan.source, plan.config
    has_tokenizer, has_template = write_tokenizer(source, stage, source.config.get("vocab_size"))
    not_streamed = "asked for (in_memory)" if config.in_memory else streaming.streamable(source, plan.task, config.enable_lora,
                                                                                          config.kernel)
    if plan.task == TEXT_GENERATION and not_streamed is not None:
        log.info("%s exports in memory (the whole model loaded): %s", source.name, not_streamed)
    skeleton = None
    if not_streamed is None:
        try:
            skeleton = streaming.skeleton(source)
        except streaming.NotStreamable as exc:
            log.info("%s exports in memory (the whole model loaded): %s", source.name, exc)
    if skeleton is not None:
        streaming.check_shapes(skeleton)
        reference = streaming.reference_model(skeleton)
    else:
        reference = _load(source, plan.task)
    return Built(reference, has_tokenizer, has_template), skeleton


def _trace_and_write(plan: Plan, built: Built, skeleton: streaming.Skeleton | None, stage: Path, bar: tqdm) -> None:
    """Stages 2 and 3, trace and write: the graphs traced, their weights rebound (streamed), quantized or rounded, and
    written to model.onnx.data (both graphs' from one copy); model.cpu.onnx's nodes fused."""
    config, dtype, source = plan.config, plan.dtype, plan.source
    trace_dir = stage / ".trace"
    trace_dir.mkdir()
    wants_cpu = plan.task == TEXT_GENERATION and config.cpu_kernel and cpu_paged.wants_cpu_graph(config.kernel, dtype,
                                                                                                   plan.cpu_kv_dtype)
    cpu_traced = None
    if plan.task == TEXT_GENERATION:
        spec = decoder_spec(built.reference, plan.kv_dtype, config.kernel, config.enable_lora)
        cpu_spec = replace(spec, kv_dtype=plan.cpu_kv_dtype or spec.kv_dtype)
        built.kind["decoder"] = spec
        if plan.quantization is not None:
            built.kind["quantization"] = plan.quantization
    if skeleton is not None:
        traced = streaming.trace(source, spec, trace_dir, DTYPES[dtype], cpu_spec if wants_cpu else None)
        _next(bar)
        blocks = (plan.quant_block_size, config.accuracy_level) if dtype in QUANTIZED else None
        built.inputs, built.outputs = streaming.place(traced, stage, spec, dtype, blocks, config.progress)
        built.cpu_graph = traced.cpu is not None
    elif plan.task == TEXT_GENERATION:
        if config.enable_lora and not spec.lora_targets:
            raise ExportError(f"--enable-lora: {source.model_type} has no nn.Linear projections under self_attn/mlp "
                              "to adapt (GPT-2's are Conv1D): export it without --enable-lora")
        trace_decoder(built.reference.to(DTYPES[dtype]), spec, trace_dir / MODEL_NAME, DTYPES[dtype])
        if wants_cpu:
            cpu_traced = trace_dir / "cpu" / MODEL_NAME
            cpu_traced.parent.mkdir()
            trace_decoder(built.reference, cpu_spec, cpu_traced, DTYPES[dtype], attention=CPU_PAGED)
        built.reference.float()  # the reference for verification: same weights, fp32 arithmetic
        _next(bar)
        built.inputs, built.outputs = _write_decoder(plan, trace_dir, stage, spec, cpu_traced)
        built.cpu_graph = cpu_traced is not None
    else:
        hf_model = built.reference
        input_names = encoder_inputs(hf_model)
        built.kind["encoder"] = encoder_spec(hf_model, source, plan.task, input_names)
        built.encoder = TracedEncoder(hf_model, plan.task, built.kind["encoder"].pooling or "", built.kind["encoder"].normalize,
                                      input_names)
        built.inputs, built.outputs = trace_encoder(built.encoder.to(DTYPES[dtype]), trace_dir / MODEL_NAME, hf_model.config.vocab_size)
        built.encoder.float()
        _next(bar)
        _place_graph(trace_dir, stage, config.external_data_threshold)
    shutil.rmtree(trace_dir, ignore_errors=True)
    if built.cpu_graph and (stage / CPU_MODEL_NAME).is_file():
        cpu_fusion.fuse_file(stage / CPU_MODEL_NAME)  # fewer nodes per one-token step (cpu_fusion.py)


def _write_decoder(plan: Plan, trace_dir: Path, stage: Path, spec, cpu_traced: Path | None) -> tuple[list, list]:
    """The in-memory path's write: the traced graphs' weights loaded, quantized or rounded, and saved into one
    model.onnx.data that both graphs share, whatever the threshold."""
    transform = cpu_transform = None
    if plan.dtype in QUANTIZED:
        rounded: dict = {}  # both graphs round each weight once
        block, level = plan.quant_block_size, plan.config.accuracy_level
        transform = lambda graph: quantize(graph, plan.dtype, block, level, cache=rounded)  # noqa: E731
        cpu_transform = lambda graph: quantize(graph, plan.dtype, block, cpu=True, cache=rounded)  # noqa: E731
    elif plan.dtype == "bf16":
        transform = to_bf16
        cpu_transform = lambda graph: to_bf16(graph, cpu=True)  # noqa: E731
    return place_decoder(trace_dir / MODEL_NAME, stage, spec, transform, cpu_traced, cpu_transform)


def _manifest(plan: Plan, built: Built, stage: Path) -> Manifest:
    """Stage 4: the generation config and the manifest, saved (figures come with verification)."""
    source = plan.source
    generation = write_generation_config(source, stage)
    cpu_kernel = None
    if built.cpu_graph:
        cpu_kernel = CpuKernel(CPU_MODEL_NAME, cpu_paged.DOMAIN, library_ops(stage / CPU_MODEL_NAME), float("nan"), "", plan.cpu_kv_dtype)
    manifest = Manifest(
        task=plan.task,
        architecture=(source.config.get("architectures") or [type(built.reference).__name__])[0],
        model_type=source.model_type,
        dtype=plan.dtype,
        inputs=tuple(built.inputs),
        outputs=tuple(built.outputs),
        eos_token_ids=token_ids(generation.get("eos_token_id", source.config.get("eos_token_id"))),
        bos_token_id=generation.get("bos_token_id", source.config.get("bos_token_id")),
        pad_token_id=generation.get("pad_token_id", source.config.get("pad_token_id")),
        has_tokenizer=built.has_tokenizer,
        has_chat_template=built.has_template,
        source=str(source.name),
        versions=versions(),
        cpu_kernel=cpu_kernel,
        **built.kind,
    )
    manifest.save(stage)
    return manifest


def _verify(plan: Plan, built: Built, manifest: Manifest, stage: Path) -> Manifest:
    """Stage 5: every figure in one go (a session per graph, a PyTorch pass per kind of sequence), checked against
    the tolerance and the quality gate; the manifest saved with them. A failure leaves nothing behind."""
    config, dtype, tolerance = plan.config, plan.dtype, plan.tolerance
    verified = None
    if plan.task == TEXT_GENERATION:
        gated = dtype in QUANTIZED or plan.cpu_kv_dtype  # on the CPU graph where there is one: int8 KV and weights together
        verified = verify_package(built.reference, stage, tolerance, config.progress, cpu_kernel=manifest.cpu_kernel is not None,
                                  quality_dtype=(dtype if dtype in QUANTIZED else "int8") if gated else None,
                                  budget=config.verify_memory)
        parity = verified.parity
    else:
        parity = verify_encoder(built.encoder, stage, tolerance, built.reference.config.vocab_size)
    if not parity.max_abs_diff <= tolerance:
        raise ExportError(
            f"verification failed: max abs difference {parity.max_abs_diff:.3g} vs PyTorch is above the "
            f"tolerance {tolerance:g} ({parity.description}); nothing was written"
        )
    manifest = replace(manifest, parity=parity)
    if manifest.cpu_kernel is not None:
        # an int8 pool rounds every K/V: its figures are the quality gate's, as for int8 weights
        cpu_tolerance = float("inf") if plan.cpu_kv_dtype else tolerance
        fused = replace(verified.cpu_parity, tolerance=cpu_tolerance)
        if not fused.max_abs_diff <= cpu_tolerance:
            raise ExportError(f"verification failed: the CPU kernel graph differs from PyTorch by "
                              f"{fused.max_abs_diff:.3g}, above the tolerance {tolerance:g} ({fused.description}); "
                              "nothing was written. Export with --no-cpu-kernel and report this")
        manifest = replace(manifest, cpu_kernel=replace(manifest.cpu_kernel, max_abs_diff=fused.max_abs_diff,
                                                        description=fused.description))
    if dtype in QUANTIZED or plan.cpu_kv_dtype:  # on the CPU graph where there is one: int8 KV and weights together
        hint = quality_hints(dtype, config.accuracy_level, plan.quant_block_size) if dtype in QUANTIZED else "--kv-dtype fp16"
        quality = gate(verified.quality, config.quality_gate,
                       f"Try {'--kv-dtype fp16, or ' if plan.cpu_kv_dtype and dtype in QUANTIZED else ''}{hint}")
        manifest = replace(manifest, quality=quality)
    manifest.save(stage)
    return manifest


def library_ops(graph: Path) -> tuple[str, ...]:
    """The kernel library's ops a graph uses, in the library's order (PagedAttention, QMatMul, MoE, BMatMul)."""
    import onnx  # here, not at the top: a serving-only install's missing extra is named by torch's import

    used = {n.op_type for n in onnx.load(str(graph), load_external_data=False).graph.node if n.domain == cpu_paged.DOMAIN}
    return tuple(op for op in (cpu_paged.OP, CPU_OP, MOE_OP, BF16_OP) if op in used)


def kv_cache_dtype(dtype: str, kv_dtype: str, kernel: str) -> str:
    """The pool's dtype. auto: the compute dtype for fp32/fp16 weights (fp32 stays exact), fp16 under
    int8/int4 weights (half the KV bytes a decode step reads: the 32-sequence step of the benchmark's
    llama 10% faster on the CPU kernel, quality figures unchanged; docs/performance.md). fp16 may be
    asked for under fp32 weights, fp32 under int8/int4."""
    if kv_dtype not in ("auto", "fp32", "fp16"):
        raise ExportError(f"unknown KV cache dtype '{kv_dtype}': choose auto, fp32, fp16 or int8")
    if dtype in QUANTIZED and kv_dtype in ("auto", "fp32"):
        return "fp16" if kv_dtype == "auto" and kernel == PORTABLE else "fp32"
    natural = "fp32" if dtype == "bf16" else dtype  # bf16 weights compute in fp32
    if kv_dtype in ("auto", natural):
        return natural
    if kv_dtype == "fp32":
        raise ExportError(f"an fp32 KV cache under {dtype} weights gains nothing: use --kv-dtype auto or fp16")
    if kernel != PORTABLE:
        raise ExportError(f"--kv-dtype fp16 under {dtype} weights needs the portable kernel")
    return kv_dtype


def quality_hints(dtype: str, accuracy_level: int, block_size: int) -> str:
    """What to try when a quantized export misses its quality gate, most promising first."""
    hints = []
    if accuracy_level != 0:
        hints.append("--accuracy-level 0 (fp32 activations: exact rounding, slower batches)")
    if block_size > 16:
        hints.append(f"--quant-block-size {block_size // 2} (finer scales)")
    if dtype == "int4":
        hints.append("--dtype int8")
    hints.append("--dtype fp32")
    return ", or ".join(hints)


def contrib_dtypes() -> tuple[str, ...]:
    from ortinf.exporter.attention_contrib import DTYPES as CONTRIB_DTYPES

    return CONTRIB_DTYPES


def check_contrib_paged(config: dict) -> None:
    """The contrib paged kernel takes no sliding window or attention soft-capping (not proven here)."""
    for key in ("sliding_window", "attn_logit_softcapping"):
        if config.get(key) and (key != "sliding_window" or config.get("use_sliding_window", True)):
            raise ExportError(f"the {CONTRIB_PAGED} kernel does not support this model's {key}: export it with --kernel portable")


def _load(source: ModelSource, task: str) -> torch.nn.Module:
    """Loads the PyTorch model at fp32 with eager attention."""
    import transformers

    loader = {
        TEXT_GENERATION: transformers.AutoModelForCausalLM,
        "text-classification": transformers.AutoModelForSequenceClassification,
        "feature-extraction": transformers.AutoModel,
    }[task]
    try:
        model = loader.from_pretrained(source.path, dtype=torch.float32, attn_implementation="eager")
    except Exception as exc:  # weights may fail in many ways; all are user-facing
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"cannot load the weights in {source.path}: {first_line}") from exc
    return model.eval()


def _place_graph(trace_dir: Path, stage: Path, threshold: int) -> None:
    """Moves the traced graph into the package, keeping weights in model.onnx.data when large."""
    traced = trace_dir / MODEL_NAME
    others = [p for p in trace_dir.iterdir() if p != traced]
    if not others and traced.stat().st_size <= threshold:
        os.replace(traced, stage / MODEL_NAME)
    else:
        import onnx

        graph = onnx.load(str(traced), load_external_data=True)
        onnx.save_model(
            graph,
            str(stage / MODEL_NAME),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=MODEL_NAME + ".data",
            size_threshold=1024,
        )
    shutil.rmtree(trace_dir)
