"""`ortinf export`: a Hugging Face model (a local folder or a hub id) to an ortinf package, verified against PyTorch."""

from __future__ import annotations

import signal
from pathlib import Path

import click

from ortinf.manifest import TASKS


def _list_architectures(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from ortinf.exporter.architectures import describe_supported

    click.echo(describe_supported())
    ctx.exit(0)


@click.command()
@click.argument("model", required=False)
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), help="Package folder to write (required).")
@click.option(
    "--task",
    type=click.Choice(["auto", *TASKS]),
    default="auto",
    show_default=True,
    help="What the package does; auto reads it from the model's config.",
)
@click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16", "int8", "int4"]), default=None,
              help="Precision: fp32/fp16 for weights, activations and KV cache; bf16 stores a decoder's MatMul weights and "
                   "embeddings in bf16 (a bf16 checkpoint's values exactly, half fp32's bytes; fp32 arithmetic and KV); "
                   "int8/int4 quantize the decoder's "
                   "MatMul weights (MatMulNBits, and ortinf.QMatMul in the CPU kernel graph; fp16 KV cache by default), "
                   "gated by quality figures. [default: fp32; a GGUF file: its own (Q8_0 -> int8, Q4_0 -> int4 with the "
                   "file's values, K-quants re-quantized)]")
@click.option("--vision-dtype", type=click.Choice(["fp32", "int8", "int4"]), default="fp32", show_default=True,
              help="Vision-language models: the vision tower's MatMul weights (int8/int4: MatMulNBits, gated by the cosine "
                   "similarity of its image embeddings to fp32's); --dtype sets the language model's.")
@click.option("--quant-block-size", type=click.IntRange(min=1), default=None, help="int8/int4: weights per quantization block [int8: 128, int4: 32].")
@click.option("--accuracy-level", type=click.IntRange(0, 4), default=4, show_default=True,
              help="int8/int4: MatMulNBits activation precision on the CPU's portable graph (0: fp32; 4: int8, faster, may "
                   "flip argmaxes). The CPU kernel graph always quantizes activations per token and block.")
@click.option("--quality-gate", type=click.Choice(["enforce", "record"]), default="enforce", show_default=True,
              help="int8/int4: enforce refuses a package whose quality figures miss their thresholds; record keeps it, "
                   "with the figures and a warning (random-weight benchmark models, or a model you have measured).")
@click.option("--kv-dtype", type=click.Choice(["auto", "fp32", "fp16", "int8"]), default="auto", show_default=True,
              help="Decoders: dtype of the paged KV cache (auto: fp16 under int8/int4 weights, else the compute dtype; "
                   "fp16 under fp32 weights halves its memory; int8: a quarter, per-token scales, read by ortinf's CPU "
                   "kernel graph only, the other providers keep auto's).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (only once the new export has verified).")
@click.option("--tolerance", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="Max abs logit difference vs PyTorch allowed at verification [fp32: 1e-3, fp16: 5e-2].")
@click.option("--kernel", type=click.Choice(["portable", "paged-attention"]), default="portable", show_default=True,
              help="Decoder attention kernel: portable (standard ONNX ops, every provider) or paged-attention "
                   "(ORT's com.microsoft.PagedAttention, fp16, for WebGPU and CUDA).")
@click.option("--cpu-kernel/--no-cpu-kernel", default=True, show_default=True,
              help="Also write model.cpu.onnx, the graph for ortinf's compiled CPU kernel library (fused paged attention; "
                   "portable fp32/int8/int4 decoders, when the library is built here).")
@click.option("--enable-lora", is_flag=True,
              help="Decoders: give the graph LoRA inputs, so `ortinf serve --lora-modules` can serve adapters "
                   "(PEFT folders, any rank, a different one per request) on this package.")
@click.option("--verify-memory", default="2GiB", show_default=True, metavar="SIZE",
              help="Decoders: layer weights one verification session may load (e.g. 1GiB). A larger package is verified "
                   "in windows of layers, each against the same layers in PyTorch, so the export's memory does not grow "
                   "with depth; raise it to verify a large model end to end in one piece.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@click.option(
    "--list-architectures",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_list_architectures,
    help="Print the supported architectures per task and exit.",
)
def export(model: str | None, out: Path | None, task: str, dtype: str, vision_dtype: str, quant_block_size: int | None, accuracy_level: int,
           quality_gate: str, kv_dtype: str, overwrite: bool, tolerance: float | None, kernel: str, cpu_kernel: bool, enable_lora: bool,
           verify_memory: str, quiet: bool) -> None:
    """Export MODEL (a local Hugging Face folder, or a hub id already in the local HF cache) to an ONNX package.

    The export is verified against PyTorch before it is written; a failed export leaves nothing behind.
    """
    if model is None:
        raise click.UsageError("missing MODEL: pass a Hugging Face model folder (or see --list-architectures)")
    if out is None:
        raise click.UsageError("missing -o/--output: pass the package folder to write")
    from ortinf.config import parse_size
    from ortinf.exporter.config import ExportConfig
    from ortinf.exporter.package import check_output
    from ortinf.exporter.source import resolve_model
    from ortinf.manifest import is_gguf

    # MODEL and OUT checked before the exporter imports torch (seconds): a wrong folder is one line at once
    config = ExportConfig(task=task, dtype=dtype, overwrite=overwrite, tolerance=tolerance, progress=not quiet, kernel=kernel,
                          quant_block_size=quant_block_size, accuracy_level=accuracy_level, kv_dtype=kv_dtype, cpu_kernel=cpu_kernel,
                          enable_lora=enable_lora, quality_gate=quality_gate, vision_dtype=vision_dtype,
                          verify_memory=parse_size(verify_memory)).check()
    check_output(out, overwrite)
    if not is_gguf(Path(model).expanduser()):
        resolve_model(model)
    from ortinf.exporter.api import export as run_export

    manifest = run_export(model, out, config)
    # The package is written (renamed into place): a Ctrl-C from here, while the result is printed and Python tears the
    # exporter down (torch's memory and threads), must not turn a finished export into exit 130.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parity = manifest.parity
    assert parity is not None
    kind = f"{manifest.task} with images ({manifest.vision.family}), {manifest.dtype}" if manifest.vision else f"{manifest.task}, {manifest.dtype}"
    click.echo(f"exported {manifest.architecture} ({kind}) to {out}: max abs diff vs PyTorch {parity.max_abs_diff:.2e}")
    if manifest.cpu_kernel is not None:
        click.echo(f"CPU kernel graph ({manifest.cpu_kernel.graph}): max abs diff vs PyTorch {manifest.cpu_kernel.max_abs_diff:.2e}")
    if manifest.quality is not None:
        q = manifest.quality
        click.echo(f"quality vs fp32: top-1 agreement {q.top1_agreement:.3f}, mean KL {q.mean_kl:.4f}, greedy agreement {q.greedy_agreement:.3f}")
        if q.failures():
            click.echo(f"warning: quality gate not met, recorded only (--quality-gate record): {'; '.join(q.failures())}", err=True)
    if manifest.speech is not None and not manifest.has_tokenizer:
        click.echo("warning: the source has no tokenizer.json: the package transcribes to token ids only (Transcriber.transcribe_ids); "
                   "`ortinf transcribe` and the audio routes need the Whisper tokenizer: re-export from a folder that has it",
                   err=True)

