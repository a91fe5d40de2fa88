"""`export()`: a Hugging Face model folder in, a verified ortinf package folder out.

    load -> trace -> save (tokenizer, chat template, generation config, manifest) -> verify -> rename
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ortinf.errors import ExportError
from ortinf.exporter import attention_cpu as cpu_paged
from ortinf.exporter import cpu_fusion, streaming
from ortinf.exporter.architectures import resolve_task
from ortinf.exporter.bf16 import CPU_OP as BF16_OP
from ortinf.exporter.bf16 import to_bf16
from ortinf.exporter.decoder import CPU_PAGED, decoder_spec, trace_decoder
from ortinf.exporter.encoder import TracedEncoder, encoder_inputs, encoder_spec, read_pooling, trace_encoder
from ortinf.exporter.kv_write import place_decoder
from ortinf.exporter.package import staging, token_ids, versions, write_generation_config, write_tokenizer
from ortinf.exporter.quantize import BITS, CPU_OP, DEFAULT_ACCURACY_LEVEL, DEFAULT_BLOCK_SIZES, MOE_OP, quantize
from ortinf.exporter.source import ModelSource, resolve_model
from ortinf.exporter.verify import gate, verify_encoder, verify_package
from ortinf.exporter.windows import VERIFY_MEMORY
from ortinf.manifest import (
    CONTRIB_PAGED,
    CPU_MODEL_NAME,
    IMAGE_TEXT_TO_TEXT,
    KERNELS,
    MANIFEST_NAME,
    MODEL_NAME,
    PORTABLE,
    SPEECH_RECOGNITION,
    TASKS,
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
QUANTIZED = ("int8", "int4")
# Quantized packages are gated by quality figures (verify.py's verify_quality), not by a logit tolerance.
# bf16: a bf16 checkpoint measures as fp32 does (the same weights, fp32 arithmetic); 5e-2 leaves room for a
# wider checkpoint rounded to bf16
DEFAULT_TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2, "fp16": 5e-2, "int8": float("inf"), "int4": float("inf")}
# Above this many bytes of weights the graph keeps them in model.onnx.data (protobuf stops at 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1 << 30
STAGES = ("loading", "tracing", "saving", "verifying")
QUALITY_GATES = ("enforce", "record")


def export(
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    task: str = "auto",
    dtype: str | None = None,
    overwrite: bool = False,
    tolerance: float | None = None,
    progress: bool = True,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
    kernel: str = PORTABLE,
    quant_block_size: int | None = None,
    accuracy_level: int = DEFAULT_ACCURACY_LEVEL,
    kv_dtype: str = "auto",
    cpu_kernel: bool = True,
    enable_lora: bool = False,
    quality_gate: str = "enforce",
    vision_dtype: str = "fp32",
    in_memory: bool = False,
    verify_memory: int = VERIFY_MEMORY,
) -> Manifest:
    """Exports MODEL (a local folder or a cached hub id) to the package folder OUT and verifies it.

    `quant_block_size`: int8/int4 weights per scale (default: int8 128, int4 32; ortinf/exporter/quantize.py).
    `cpu_kernel`: also write model.cpu.onnx, the graph for ortinf's CPU kernel library (portable
    fp32/int8/int4 decoders; needs the library built here, to verify it; skipped with a warning if not).
    `enable_lora`: decoders get LoRA inputs (ortinf/exporter/lora.py) for serving adapters.
    `quality_gate`: int8/int4 quality figures below their thresholds refuse the export ("enforce"), or
    are recorded in the manifest with a warning ("record": random-weight benchmark models, whose flat
    next-token distributions flip argmaxes under any rounding, or a user who has measured otherwise).
    `vision_dtype`: a vision-language model's vision tower weights (fp32, int8, int4); `dtype` is its language model's.
    `in_memory`: export a decoder the way models that the streaming exporter does not cover are exported (the whole
    model loaded and traced; ortinf/exporter/streaming.py): for comparisons.
    `verify_memory`: a decoder whose layer weights exceed these bytes is verified in windows of layers, each
    within them (ortinf/exporter/windows.py), so verification's memory does not grow with depth.

    MODEL may also be a GGUF file (llama.cpp's, Ollama's): it is read into a temporary Hugging Face folder
    first (ortinf/exporter/gguf_source.py); `dtype` None exports it at the file's own precision (Q8_0 and
    Q4_0: int8 / int4 with the file's values exactly). `dtype` None is fp32 for a folder.

    Raises ExportError (or a subclass) with a message that says what to change.
    """
    if is_gguf(Path(model).expanduser()):
        import tempfile

        from ortinf.exporter.gguf_source import file_quantization, gguf_to_folder, without_vocab_hole_warnings

        if dtype is None:
            found = file_quantization(Path(model).expanduser())
            dtype, quant_block_size = found.dtype, quant_block_size or found.block_size
            log.warning("%s: %s (pass --dtype to choose)", Path(model).name, found.describe())

        options = dict(task=task, dtype=dtype, overwrite=overwrite, tolerance=tolerance, progress=progress,
                       external_data_threshold=external_data_threshold, kernel=kernel, quant_block_size=quant_block_size,
                       accuracy_level=accuracy_level, kv_dtype=kv_dtype, cpu_kernel=cpu_kernel, enable_lora=enable_lora,
                       quality_gate=quality_gate, verify_memory=verify_memory)
        gguf_path = Path(model).expanduser().resolve()
        with tempfile.TemporaryDirectory(prefix="ortinf-gguf-") as folder, without_vocab_hole_warnings():
            manifest = export(gguf_to_folder(gguf_path, Path(folder)), out, **options)
        manifest = replace(manifest, source=str(gguf_path))  # the file, not the temporary folder it went through
        (Path(out).expanduser() / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
        return manifest
    dtype = dtype or "fp32"
    if task != "auto" and task not in TASKS:
        raise ExportError(f"unknown task '{task}': choose auto, {', '.join(TASKS)}")
    if dtype not in DTYPES:
        raise ExportError(f"unknown dtype '{dtype}': choose {', '.join(DTYPES)}")
    if quality_gate not in QUALITY_GATES:
        raise ExportError(f"unknown quality gate '{quality_gate}': choose {' or '.join(QUALITY_GATES)}")
    if not isinstance(verify_memory, int) or verify_memory < 1:
        raise ExportError(f"verify_memory must be a positive number of bytes, got {verify_memory!r}")
    if kernel not in KERNELS:
        raise ExportError(f"unknown kernel '{kernel}': choose {', '.join(KERNELS)}")
    if kernel == CONTRIB_PAGED and dtype not in contrib_dtypes():
        raise ExportError(f"the {kernel} kernel runs at {', '.join(contrib_dtypes())} only: pass --dtype fp16")
    requested_kv, cpu_kv_dtype = kv_dtype, "int8" if kv_dtype == "int8" else ""
    if cpu_kv_dtype and (kernel != PORTABLE or not cpu_kernel):
        raise ExportError("--kv-dtype int8 is read by ortinf's CPU kernel graph only: drop --kernel/--no-cpu-kernel, "
                          "or choose --kv-dtype fp16")
    kv_dtype = kv_cache_dtype(dtype, "auto" if cpu_kv_dtype else kv_dtype, kernel)
    tolerance = DEFAULT_TOLERANCE[kv_dtype if dtype == "fp32" else dtype] if tolerance is None else tolerance
    out_path = Path(out).expanduser().resolve()
    source = resolve_model(str(model))
    task = resolve_task(source.model_type, source.config.get("architectures"), task)
    if vision_dtype not in ("fp32", *QUANTIZED):
        raise ExportError(f"unknown vision dtype '{vision_dtype}': choose fp32, {', '.join(QUANTIZED)}")
    if vision_dtype != "fp32" and task != IMAGE_TEXT_TO_TEXT:
        raise ExportError(f"--vision-dtype is for vision-language models; {source.name} is a {task} model: drop it")
    quant_block_size = quant_block_size or DEFAULT_BLOCK_SIZES.get(dtype, 32)
    if dtype in QUANTIZED and (quant_block_size < 16 or quant_block_size & (quant_block_size - 1)):
        raise ExportError(f"--quant-block-size must be a power of two >= 16, got {quant_block_size}")
    if task in (SPEECH_RECOGNITION, TEXT2TEXT) and requested_kv != "auto":
        raise ExportError(f"--kv-dtype is for decoder-only models; {source.name} is a {task} model (its KV cache is fp32)")
    if task == SPEECH_RECOGNITION:
        if dtype not in ("fp32", *QUANTIZED) or kernel != PORTABLE or enable_lora:
            raise ExportError(f"{source.name} is a speech model: export it at --dtype fp32, int8 or int4 with the portable kernel "
                              "(fp16, LoRA and the paged-attention kernel are not built for Whisper)")
        from ortinf.exporter.whisper import export_whisper

        return export_whisper(source, out_path, overwrite, tolerance, progress, dtype, quant_block_size, accuracy_level,
                              quality_gate)
    if task == IMAGE_TEXT_TO_TEXT:
        if dtype == "bf16":
            raise ExportError(f"--dtype bf16 is for text decoders so far; {source.name} is a vision-language model: "
                              "export it at fp32, int8 or int4")
        if enable_lora:
            raise ExportError(f"--enable-lora is for text decoders; {source.name} is a vision-language model")
        from ortinf.exporter.vision_language import export_vision_language

        return export_vision_language(source, out_path, export, overwrite, tolerance, progress, vision_dtype=vision_dtype, dtype=dtype,
                                      external_data_threshold=external_data_threshold, kernel=kernel, quant_block_size=quant_block_size,
                                      accuracy_level=accuracy_level, kv_dtype=requested_kv, cpu_kernel=cpu_kernel, quality_gate=quality_gate)
    if task == TEXT2TEXT:
        if dtype != "fp32" or kernel != PORTABLE or enable_lora:
            raise ExportError(f"{source.name} is a text encoder-decoder: export it at --dtype fp32 with the portable kernel")
        from ortinf.exporter.seq2seq import export_seq2seq

        return export_seq2seq(source, out_path, overwrite, tolerance, progress)
    if task != TEXT_GENERATION:
        read_pooling(source)  # refuse unsupported sentence-transformers modules before loading weights
        if dtype in (*QUANTIZED, "bf16"):
            raise ExportError(f"--dtype {dtype} is for decoders; {source.name} is a {task} model: export it at fp32 or fp16")
        if kernel != PORTABLE:
            raise ExportError(f"--kernel {kernel} is for decoders; {source.name} is a {task} model")
        if kv_dtype != dtype or cpu_kv_dtype:
            raise ExportError(f"--kv-dtype is for decoders; {source.name} is a {task} model")
        if enable_lora:
            raise ExportError(f"--enable-lora is for decoders; {source.name} is a {task} model")
    elif kernel == CONTRIB_PAGED:
        check_contrib_paged(source.config)

    not_streamed = "asked for (in_memory)" if in_memory else streaming.streamable(source, task, enable_lora, kernel)
    if task == TEXT_GENERATION and not_streamed is not None:
        log.info("%s exports in memory (the whole model loaded): %s", source.name, not_streamed)
    bar = tqdm(total=len(STAGES), desc=STAGES[0], disable=not progress, bar_format="{desc:<10} {bar} {n}/{total} [{elapsed}]")
    with staging(out_path, overwrite) as stage, bar:
        # the tokenizer first: one that does not fit the vocabulary is refused before the slow part
        has_tokenizer, has_template = write_tokenizer(source, stage, source.config.get("vocab_size"))
        skel = None
        if not_streamed is None:
            try:  # the weights stay in the checkpoint: the reference model loads one module's at a time
                skel = streaming.skeleton(source)
            except streaming.NotStreamable as exc:
                log.info("%s exports in memory (the whole model loaded): %s", source.name, exc)
        if skel is not None:
            streaming.check_shapes(skel)
            hf_model = streaming.reference_model(skel)
        else:
            hf_model = _load(source, task)
        bar.update()
        bar.set_description_str(STAGES[1])
        trace_dir = stage / ".trace"
        trace_dir.mkdir()
        cpu_traced = None
        if skel is not None:
            spec = decoder_spec(hf_model, kv_dtype, kernel, enable_lora)
            wants_cpu = cpu_kernel and cpu_paged.wants_cpu_graph(kernel, dtype, cpu_kv_dtype)
            traced = streaming.trace(source, spec, trace_dir, DTYPES[dtype],
                                     replace(spec, kv_dtype=cpu_kv_dtype or spec.kv_dtype) if wants_cpu else None)
            cpu_traced = traced.cpu
            kind = {"decoder": spec}
            bar.update()
            bar.set_description_str(STAGES[2])
            if dtype in QUANTIZED:
                kind["quantization"] = Quantization(BITS[dtype], quant_block_size, accuracy_level)
            inputs, outputs = streaming.place(traced, stage, spec, dtype,
                                              (quant_block_size, accuracy_level) if dtype in QUANTIZED else None, progress)
            shutil.rmtree(trace_dir)
        elif task == TEXT_GENERATION:
            spec = decoder_spec(hf_model, kv_dtype, kernel, enable_lora)
            if enable_lora and not spec.lora_targets:
                raise ExportError(f"--enable-lora: {source.model_type} has no nn.Linear projections under self_attn/mlp "
                                  "to adapt (GPT-2's are Conv1D): export it without --enable-lora")
            trace_decoder(hf_model.to(DTYPES[dtype]), spec, trace_dir / MODEL_NAME, DTYPES[dtype])
            if cpu_kernel and cpu_paged.wants_cpu_graph(kernel, dtype, cpu_kv_dtype):
                cpu_traced = trace_dir / "cpu" / MODEL_NAME
                cpu_traced.parent.mkdir()
                trace_decoder(hf_model, replace(spec, kv_dtype=cpu_kv_dtype or spec.kv_dtype), cpu_traced, DTYPES[dtype],
                              attention=CPU_PAGED)
            hf_model.float()  # the reference for verification: same weights, fp32 arithmetic
            kind = {"decoder": spec}
        else:
            input_names = encoder_inputs(hf_model)
            kind = {"encoder": encoder_spec(hf_model, source, task, input_names)}
            encoder = TracedEncoder(hf_model, task, kind["encoder"].pooling or "", kind["encoder"].normalize, input_names)
            inputs, outputs = trace_encoder(encoder.to(DTYPES[dtype]), trace_dir / MODEL_NAME, hf_model.config.vocab_size)
            encoder.float()
        if skel is None:  # the in-memory path: the traced graphs' weights are loaded, transformed and saved
            bar.update()
            bar.set_description_str(STAGES[2])
            if task == TEXT_GENERATION:  # two graphs sharing model.onnx.data, whatever the threshold
                transform = cpu_transform = None
                if dtype in QUANTIZED:
                    kind["quantization"] = Quantization(BITS[dtype], quant_block_size, accuracy_level)
                    rounded: dict = {}  # both graphs round each weight once
                    transform = lambda graph: quantize(graph, dtype, quant_block_size, accuracy_level, cache=rounded)  # noqa: E731
                    cpu_transform = lambda graph: quantize(graph, dtype, quant_block_size, cpu=True, cache=rounded)  # noqa: E731
                elif dtype == "bf16":
                    transform = to_bf16
                    cpu_transform = lambda graph: to_bf16(graph, cpu=True)  # noqa: E731
                inputs, outputs = place_decoder(trace_dir / MODEL_NAME, stage, spec, transform, cpu_traced, cpu_transform)
                shutil.rmtree(trace_dir)
            else:
                _place_graph(trace_dir, stage, external_data_threshold)
        if cpu_traced is not None and (stage / CPU_MODEL_NAME).is_file():
            cpu_fusion.fuse_file(stage / CPU_MODEL_NAME)  # fewer nodes per one-token step (cpu_fusion.py)
        generation = write_generation_config(source, stage)
        manifest = Manifest(
            task=task,
            architecture=(source.config.get("architectures") or [type(hf_model).__name__])[0],
            model_type=source.model_type,
            dtype=dtype,
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            eos_token_ids=token_ids(generation.get("eos_token_id", source.config.get("eos_token_id"))),
            bos_token_id=generation.get("bos_token_id", source.config.get("bos_token_id")),
            pad_token_id=generation.get("pad_token_id", source.config.get("pad_token_id")),
            has_tokenizer=has_tokenizer,
            has_chat_template=has_template,
            source=str(source.name),
            versions=versions(),
            cpu_kernel=CpuKernel(CPU_MODEL_NAME, cpu_paged.DOMAIN, library_ops(stage / CPU_MODEL_NAME), float("nan"), "", cpu_kv_dtype)
            if cpu_traced is not None else None,
            **kind,
        )
        manifest.save(stage)
        bar.update()
        bar.set_description_str(STAGES[3])
        verified = None
        if task == TEXT_GENERATION:  # every figure in one go: a session per graph, a PyTorch pass per kind of sequence
            gated = dtype in QUANTIZED or cpu_kv_dtype  # on the CPU graph where there is one: int8 KV and weights together
            verified = verify_package(hf_model, stage, tolerance, progress, cpu_kernel=manifest.cpu_kernel is not None,
                                      quality_dtype=(dtype if dtype in QUANTIZED else "int8") if gated else None,
                                      budget=verify_memory)
            parity = verified.parity
        else:
            parity = verify_encoder(encoder, stage, tolerance, hf_model.config.vocab_size)
        if not parity.max_abs_diff <= tolerance:
            raise ExportError(
                f"verification failed: max abs difference {parity.max_abs_diff:.3g} vs PyTorch is above the "
                f"tolerance {tolerance:g} ({parity.description}); nothing was written"
            )
        manifest = replace(manifest, parity=parity)
        if manifest.cpu_kernel is not None:
            # an int8 pool rounds every K/V: its figures are the quality gate's, as for int8 weights
            cpu_tolerance = float("inf") if cpu_kv_dtype else tolerance
            fused = replace(verified.cpu_parity, tolerance=cpu_tolerance)
            if not fused.max_abs_diff <= cpu_tolerance:
                raise ExportError(f"verification failed: the CPU kernel graph differs from PyTorch by "
                                  f"{fused.max_abs_diff:.3g}, above the tolerance {tolerance:g} ({fused.description}); "
                                  "nothing was written. Export with --no-cpu-kernel and report this")
            manifest = replace(manifest, cpu_kernel=replace(manifest.cpu_kernel, max_abs_diff=fused.max_abs_diff,
                                                            description=fused.description))
        if dtype in QUANTIZED or cpu_kv_dtype:  # on the CPU graph where there is one: int8 KV and weights together
            hint = quality_hints(dtype, accuracy_level, quant_block_size) if dtype in QUANTIZED else "--kv-dtype fp16"
            quality = gate(verified.quality, quality_gate,
                           f"Try {'--kv-dtype fp16, or ' if cpu_kv_dtype and dtype in QUANTIZED else ''}{hint}")
            manifest = replace(manifest, quality=quality)
        manifest.save(stage)
        bar.update()
    log.info("exported %s to %s (max abs diff %.3g)", source.name, out_path, parity.max_abs_diff)
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
    except Exception as exc:  # noqa: BLE001 - weights may fail in many ways; all are user-facing
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
