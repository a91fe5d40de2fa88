"""The `ortinf` command line. User errors print one line and exit 2; they never show a traceback."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

import ortinf
from ortinf.cli.exit_codes import run
from ortinf.cli.serve_options import check_port, engine_options, engine_values, load_yaml_config
from ortinf.manifest import TASKS, TEXT_GENERATION, Manifest

# Engine options a command does not take, because it cannot use them: one stream (generate, chat: --seed
# is the request's there), or a speech model (no speculative decoding, no LoRA).
SINGLE_STREAM_EXCLUDED = frozenset({"seed", "max_num_seqs", "lora_modules", "max_loras", "max_lora_rank"})
SPEECH_EXCLUDED = frozenset({"speculative_config", "lora_modules", "max_loras", "max_lora_rank"})



def _list_architectures(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from ortinf.exporter.architectures import describe_supported

    click.echo(describe_supported())
    ctx.exit(0)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(ortinf.__version__, "--version", "-V", prog_name="ortinf")
@click.option("-v", "--verbose", is_flag=True, help="Log what ortinf decides (provider, sizes, figures).")
def cli(verbose: bool) -> None:
    """ortinf: export Hugging Face models to ONNX packages and serve them on any ONNX Runtime provider."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@cli.command()
@click.argument("model", required=False)
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), help="Package folder to write (required).")
@click.option(
    "--task",
    type=click.Choice(["auto", *TASKS]),
    default="auto",
    show_default=True,
    help="What the package does; auto reads it from the model's config.",
)
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "int8", "int4"]), default="fp32", show_default=True,
              help="Precision: fp32/fp16 for weights, activations and KV cache; int8/int4 quantize the decoder's "
                   "MatMul weights (MatMulNBits, and ortinf.QMatMul in the CPU kernel graph; fp16 KV cache by default), "
                   "gated by quality figures.")
@click.option("--quant-block-size", type=int, default=None, help="int8/int4: weights per quantization block [int8: 128, int4: 32].")
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
@click.option("--tolerance", type=float, default=None, help="Max abs logit difference vs PyTorch allowed at verification [fp32: 1e-3, fp16: 5e-2].")
@click.option("--kernel", type=click.Choice(["portable", "paged-attention"]), default="portable", show_default=True,
              help="Decoder attention kernel: portable (standard ONNX ops, every provider) or paged-attention "
                   "(ORT's com.microsoft.PagedAttention, fp16, for WebGPU and CUDA).")
@click.option("--cpu-kernel/--no-cpu-kernel", default=True, show_default=True,
              help="Also write model.cpu.onnx, the graph for ortinf's compiled CPU kernel library (fused paged attention; "
                   "portable fp32/int8/int4 decoders, when the library is built here).")
@click.option("--enable-lora", is_flag=True,
              help="Decoders: give the graph LoRA inputs, so `ortinf serve --lora-modules` can serve adapters "
                   "(PEFT folders, any rank, a different one per request) on this package.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@click.option(
    "--list-architectures",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_list_architectures,
    help="Print the supported architectures per task and exit.",
)
def export(model: str | None, out: Path | None, task: str, dtype: str, quant_block_size: int | None, accuracy_level: int,
           quality_gate: str, kv_dtype: str, overwrite: bool, tolerance: float | None, kernel: str, cpu_kernel: bool, enable_lora: bool,
           quiet: bool) -> None:
    """Export MODEL (a local Hugging Face folder, or a hub id already in the local HF cache) to an ONNX package.

    The export is verified against PyTorch before it is written; a failed export leaves nothing behind.
    """
    if model is None:
        raise click.UsageError("missing MODEL: pass a Hugging Face model folder (or see --list-architectures)")
    if out is None:
        raise click.UsageError("missing -o/--output: pass the package folder to write")
    from ortinf.exporter.api import export as run_export

    manifest = run_export(model, out, task=task, dtype=dtype, overwrite=overwrite, tolerance=tolerance, progress=not quiet,
                          kernel=kernel, quant_block_size=quant_block_size, accuracy_level=accuracy_level, kv_dtype=kv_dtype,
                          cpu_kernel=cpu_kernel, enable_lora=enable_lora, quality_gate=quality_gate)
    parity = manifest.parity
    assert parity is not None
    click.echo(f"exported {manifest.architecture} ({manifest.task}, {manifest.dtype}) to {out}: max abs diff vs PyTorch {parity.max_abs_diff:.2e}")
    if manifest.cpu_kernel is not None:
        click.echo(f"CPU kernel graph ({manifest.cpu_kernel.graph}): max abs diff vs PyTorch {manifest.cpu_kernel.max_abs_diff:.2e}")
    if manifest.quality is not None:
        q = manifest.quality
        click.echo(f"quality vs fp32: top-1 agreement {q.top1_agreement:.3f}, mean KL {q.mean_kl:.4f}, greedy agreement {q.greedy_agreement:.3f}")
        if q.failures():
            click.echo(f"warning: quality gate not met, recorded only (--quality-gate record): {'; '.join(q.failures())}", err=True)


@cli.command()
@click.argument("package")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "output_format", type=click.Choice(["text", "json", "srt", "vtt"]), default="text", show_default=True,
              help="What to print per file (srt/vtt: one cue per timestamped segment, or per 30-second window).")
@click.option("--language", default=None, help="The spoken language (e.g. en, de) of a multilingual model [default: detected].")
@click.option("--translate", is_flag=True, help="Translate into English instead of transcribing (multilingual models).")
@click.option("--temperature", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Sampling temperature; 0 is greedy, retried hotter for windows that repeat or are unlikely.")
@click.option("--no-fallback", is_flag=True, help="Decode at --temperature only: no hotter retries, no silence skipping.")
@engine_options(exclude=SPEECH_EXCLUDED)
def transcribe(package: str, files: tuple[Path, ...], output_format: str, language: str | None, translate: bool,
               temperature: float, no_fallback: bool, **engine_given: object) -> None:
    """Transcribe audio FILES (wav, flac, ogg, mp3) with PACKAGE, a Whisper package made by `ortinf export`.

    All files are transcribed together; a model with timestamp tokens goes window after window, each
    prompted with the text so far (openai-whisper's long-form decoding)."""
    from ortinf.bundled import resolve_package
    from ortinf.cli.transcribe import transcribe_files

    transcribe_files(resolve_package(package), files, output_format, language, "translate" if translate else "transcribe",
                     temperature, not no_fallback, engine_values(engine_given))


@cli.command()
@click.argument("package", required=False)
def inspect(package: str | None) -> None:
    """Print the manifest of PACKAGE as a table.

    PACKAGE is a folder made by `ortinf export`, a Hugging Face model folder (exported into the package
    cache on first use), or a bundled model's name (ortinf-demo-llama, all-MiniLM-L6-v2); default: the
    bundled demo llama."""
    from ortinf.bundled import resolve_package
    from ortinf.cli.inspect_table import manifest_rows

    package = resolve_package(package)
    manifest = Manifest.load(package)
    rows = manifest_rows(manifest, package)
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")


@cli.command()
@click.argument("package", required=False)
@click.option("-p", "--prompt", help="Prompt text.")
@click.option("--prompt-ids", help="Prompt as comma-separated token ids (for packages without a tokenizer).")
@click.option("-n", "--max-tokens", type=int, default=64, show_default=True, help="Most tokens to generate.")
@click.option("-t", "--temperature", type=float, default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="Nucleus sampling mass.")
@click.option("--top-k", type=int, default=0, show_default=True, help="Sample among the k most likely tokens (0: all).")
@click.option("--min-p", type=float, default=0.0, show_default=True, help="Drop tokens below min_p x the top probability.")
@click.option("--repetition-penalty", type=float, default=1.0, show_default=True, help="vLLM's repetition penalty.")
@click.option("--seed", type=int, default=None, help="Makes sampling reproducible.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@engine_options(exclude=SINGLE_STREAM_EXCLUDED)
def generate(package: str | None, prompt: str | None, prompt_ids: str | None, max_tokens: int, temperature: float, top_p: float,
             top_k: int, min_p: float, repetition_penalty: float, seed: int | None, stop: tuple[str, ...], ignore_eos: bool,
             **engine_given: object) -> None:
    """Generate a continuation of a prompt with a text-generation PACKAGE, streaming it to the terminal.

    PACKAGE is a folder made by `ortinf export`, a Hugging Face model folder (exported into the package
    cache on first use), or a bundled model's name; default: the bundled demo llama (ortinf-demo-llama)."""
    from ortinf.bundled import resolve_package
    from ortinf.cli.generate import stream_generation

    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("pass exactly one of --prompt and --prompt-ids")
    stream_generation(
        resolve_package(package), prompt if prompt is not None else _parse_ids(prompt_ids or ""), engine_values(engine_given),
        dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
             repetition_penalty=repetition_penalty, seed=seed, stop=stop, ignore_eos=ignore_eos),
    )


@cli.command()
@click.argument("package", required=False)
@click.option("--system", default=None, help="A system message opening the conversation.")
@click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=256, show_default=True, help="Most tokens per reply.")
@click.option("-t", "--temperature", type=float, default=0.7, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=float, default=0.95, show_default=True, help="Nucleus sampling mass.")
@click.option("--seed", type=int, default=None, help="Makes sampling reproducible.")
@engine_options(exclude=SINGLE_STREAM_EXCLUDED)
def chat(package: str | None, system: str | None, max_tokens: int, temperature: float, top_p: float, seed: int | None,
         **engine_given: object) -> None:
    """Chat with PACKAGE in the terminal, replies streamed; /reset, /exit.

    PACKAGE is a folder made by `ortinf export`, a Hugging Face model folder (exported into the package
    cache on first use), or a bundled model's name; default: the bundled demo llama (ortinf-demo-llama)."""
    from ortinf.bundled import resolve_package
    from ortinf.cli.chat import chat as run_chat

    run_chat(resolve_package(package), system, engine_values(engine_given),
             dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed))


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError as exc:
        raise click.BadParameter("write token ids as comma-separated integers, e.g. 1,15,2043", param_hint="--prompt-ids") from exc


@cli.command()
@click.argument("packages", nargs=-1)
@click.option("--config", type=click.Path(path_type=Path, dir_okay=False), is_eager=True, expose_value=False,
              callback=load_yaml_config, help="YAML file of options (keys as the option names, e.g. port: 8000).")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="ORTINF_HOST", help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, envvar="ORTINF_PORT", help="Port to listen on.")
@click.option("--served-model-name", "served_model_names", multiple=True, envvar="ORTINF_SERVED_MODEL_NAME",
              help="Name clients use in `model` (one per package) [default: the package folder's name].")
@click.option("--api-key", envvar="ORTINF_API_KEY", help="Require `Authorization: Bearer KEY` on /v1 routes.")
@click.option("--max-queued-requests", type=int, default=256, show_default=True, envvar="ORTINF_MAX_QUEUED_REQUESTS",
              help="Requests that may wait beyond the running batch; past that the server answers 429.")
@click.option("--shutdown-timeout", type=float, default=30.0, show_default=True, envvar="ORTINF_SHUTDOWN_TIMEOUT",
              help="On SIGTERM, seconds to let in-flight requests finish.")
@click.option("--max-body-size", default="2MiB", show_default=True, envvar="ORTINF_MAX_BODY_SIZE",
              help="Largest request body accepted (413 beyond), on every route but the audio uploads (--max-audio-body-size).")
@click.option("--max-audio-body-size", default="26MiB", show_default=True, envvar="ORTINF_MAX_AUDIO_BODY_SIZE",
              help="Largest body of /v1/audio/transcriptions and /v1/audio/translations (413 beyond): the audio file "
                   "(OpenAI's limit is 25 MiB) and its form fields.")
@click.option("--tool-call-parser", type=click.Choice(["auto", "hermes", "none"]), default="auto", show_default=True,
              envvar="ORTINF_TOOL_CALL_PARSER",
              help="How tool calls are read from a model's text for tool_choice 'auto': hermes (<tool_call>{json}</tool_call>, "
                   "Qwen and Hermes models), none, or auto (hermes when the chat template writes <tool_call>).")
@click.option("--metrics-prefix", type=click.Choice(["ortinf", "vllm"]), default="ortinf", show_default=True, envvar="ORTINF_METRICS_PREFIX",
              help="Prefix of the /metrics names; vllm gives vllm:num_requests_waiting, vllm:kv_cache_usage_perc, ... "
                   "for dashboards and cluster routers (llm-d, the Gateway API Inference Extension) that look for them.")
@click.option("--allow-runtime-lora-updates", is_flag=True, envvar="ORTINF_ALLOW_RUNTIME_LORA_UPDATES",
              help="Mount /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's): a client may then make the server "
                   "read any adapter folder it names; set --max-loras for the slots.")
@click.option("--ray", "use_ray", is_flag=True, help="Serve on Ray Serve (pip install 'ortinf[ray]'): replicas behind Ray's HTTP proxy.")
@click.option("--num-replicas", type=click.IntRange(min=1), default=1, show_default=True, help="With --ray: replicas (engines).")
@click.option("--min-replicas", type=click.IntRange(min=1), default=None, help="With --ray: autoscale from this many replicas...")
@click.option("--max-replicas", type=click.IntRange(min=1), default=None, help="...up to this many.")
@click.option("--target-ongoing-requests", type=click.FloatRange(min=0.1), default=None,
              help="With --ray and autoscaling: requests in flight per replica to aim for [default: --max-num-seqs / 2].")
@click.option("--cpus-per-replica", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="With --ray: CPUs Ray reserves per replica (set --intra-op-threads to match).")
@click.option("--gpus-per-replica", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="With --ray: GPUs per replica (one per replica for a device provider).")
@click.option("--prefix-routing", is_flag=True,
              help="With --ray: send requests that share a prompt prefix to the same replica (its prefix cache), "
                   "through a front deployment; the least loaded replica when that one is far behind.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True, envvar="ORTINF_LOG_LEVEL")
@click.option("--transcription-fallback/--no-transcription-fallback", default=True, show_default=True,
              help="Whisper models: at temperature 0, retry windows that repeat or are unlikely at hotter temperatures and "
                   "skip silent ones (OpenAI's and openai-whisper's behaviour); off: the request's temperature alone.")
@engine_options()
def serve(packages: tuple[Path, ...], host: str, port: int, served_model_names: tuple[str, ...], api_key: str | None,
          max_queued_requests: int, shutdown_timeout: float, max_body_size: str, max_audio_body_size: str, tool_call_parser: str,
          metrics_prefix: str, use_ray: bool, num_replicas: int, min_replicas: int | None, max_replicas: int | None,
          target_ongoing_requests: float | None, cpus_per_replica: float, gpus_per_replica: float, prefix_routing: bool,
          allow_runtime_lora_updates: bool, log_level: str, transcription_fallback: bool, **engine_given: object) -> None:
    """Serve PACKAGES behind an OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/embeddings).

    PACKAGES are folders made by `ortinf export`, or Hugging Face model folders, exported into the package
    cache (~/.cache/ortinf, or $ORTINF_CACHE) on first use and reused after. With no PACKAGES, serves the
    bundled demo language model and embedding model the same way. Requests are routed to a model by
    their `model` field.
    """
    from ortinf.config import EngineConfig, parse_size
    from ortinf.serve.app import model_names
    from ortinf.serve.server import run
    from ortinf.serve.state import ServerConfig

    engine = engine_values(engine_given)  # the engine's options, as EngineConfig takes them (generated from its fields)
    if not use_ray:
        check_port(host, port)  # before minutes of loading (or exporting) models, not after
    if not packages:
        from ortinf.bundled import ensure_exported

        bundled = ensure_exported()
        packages = tuple(path for _, path in bundled)
        served_model_names = served_model_names or tuple(name for name, _ in bundled)
    else:
        from ortinf.bundled import resolve_package

        packages = tuple(resolve_package(p) for p in packages)  # a Hugging Face folder is exported into the cache once
    for package in packages:  # a wrong path or a broken package fails now, in one line, before the server starts
        manifest = Manifest.load(package)
        spec = manifest.decoder or manifest.encoder
        if manifest.has_tokenizer and spec is not None:
            from ortinf.tokenizer import load_checked_tokenizer

            load_checked_tokenizer(package, spec.vocab_size)
    from ortinf.providers.base import DEVICE
    from ortinf.providers.registry import resolve

    found = resolve(engine["provider"])  # a missing provider fails now, in one line
    checked = EngineConfig(package_dir=Path("."), **engine)  # so do a bad size, --speculative-config or --lora-modules
    spec = checked.speculative_config
    if spec is not None and spec.model is not None:  # and a draft model that is not there (a Hugging Face folder is exported)
        from dataclasses import asdict, replace

        from ortinf.bundled import resolve_package

        draft = resolve_package(Path(spec.model))
        Manifest.load(draft)
        engine["speculative_config"] = json.dumps(asdict(replace(spec, model=str(draft))))
    if found.provider.memory == DEVICE and checked.kv_cache_memory is None and checked.num_blocks is None \
            and any(Manifest.load(p).decoder for p in packages):
        raise click.UsageError(f"the {found.provider.name} provider keeps the KV cache in device memory, whose free size ORT "
                               "does not report: pass --kv-cache-memory (e.g. 2GiB)")
    if served_model_names and len(served_model_names) != len(packages):
        raise click.UsageError(f"pass one --served-model-name per package ({len(packages)}), or none")
    config = ServerConfig(
        packages=tuple(packages), host=host, port=port, served_model_names=served_model_names, api_key=api_key,
        max_queued_requests=max_queued_requests, shutdown_timeout=shutdown_timeout, max_body_size=parse_size(max_body_size),
        max_audio_body_size=parse_size(max_audio_body_size), tool_call_parser=tool_call_parser, metrics_prefix=metrics_prefix,
        allow_runtime_lora_updates=allow_runtime_lora_updates, transcription_fallback=transcription_fallback, engine_options=engine,
    )
    names = model_names(config)
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise click.UsageError(f"two packages would both be served as {duplicates[0]!r}: name them with --served-model-name")
    ray_only = {"--num-replicas": num_replicas != 1, "--min-replicas": min_replicas is not None, "--max-replicas": max_replicas is not None,
                "--target-ongoing-requests": target_ongoing_requests is not None, "--prefix-routing": prefix_routing}
    given = [name for name, set_ in ray_only.items() if set_]
    if given and not use_ray:
        raise click.UsageError(f"{given[0]} needs --ray")
    if use_ray:
        from ortinf.serve.ray_serve import RayOptions, run_on_ray

        run_on_ray(config, RayOptions(num_replicas, min_replicas, max_replicas, target_ongoing_requests, cpus_per_replica,
                                      gpus_per_replica, prefix_routing), log_level)
        return
    run(config, log_level)


@cli.command()
def providers() -> None:
    """List the execution providers: installed or not, their devices, what they run, how to add them."""
    from ortinf.kernels import library
    from ortinf.providers.table import format_table, rows

    click.echo(format_table(rows()))
    click.echo(f"\ncpu attention kernel: {library.describe()} (packages exported with it run model.cpu.onnx on the cpu provider)")


@cli.command()
@click.argument("packages", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(path_type=Path, file_okay=False), default=Path("hardware_matrix"), show_default=True,
              help="Folder for matrix.csv and RESULTS.md (rows merge into what is there).")
@click.option("--python", "pythons", multiple=True, metavar="PYTHON",
              help="Python of an environment with ortinf and other providers installed (repeatable; default: this one), "
                   "e.g. .venv-openvino/bin/python.")
@click.option("--threads", type=click.IntRange(min=0), default=0, show_default=True, help="Intra-op threads per row (0: all cores).")
@click.option("--providers", "only", default=None, metavar="NAME,...", help="Measure only these providers (default: every one installed).")
def matrix(packages: tuple[str, ...], output: Path, pythons: tuple[str, ...], threads: int, only: str | None) -> None:
    """Measure every installed provider x every decoder PACKAGE: quality against the fp32 package on
    the CPU, greedy agreement, tokens/s and TTFT at concurrency 1 and 32, peak RSS."""
    from ortinf.bundled import resolve_package
    from ortinf.matrix import markdown, run_matrix
    from ortinf.providers.registry import PROVIDERS

    unknown = [name for name in (only or "").split(",") if name and name not in PROVIDERS]
    if unknown:
        raise click.UsageError(f"unknown provider {', '.join(unknown)} in --providers: choose among {', '.join(PROVIDERS)}")
    packages = tuple(resolve_package(p) for p in packages)
    for package in packages:
        if Manifest.load(package).task != TEXT_GENERATION:
            raise click.UsageError(f"{package} is not a decoder package: the matrix measures text generation")
    try:
        rows = run_matrix(list(packages), list(pythons) or [sys.executable], output, threads,
                          progress=lambda line: click.echo(line, err=True), only=only.split(",") if only else None)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    from dataclasses import asdict

    click.echo("\n".join(markdown([asdict(r) for r in rows])))
    click.echo(f"written: {output / 'matrix.csv'}, {output / 'RESULTS.md'}", err=True)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port to listen on.")
@click.pass_context
def demo(ctx: click.Context, host: str, port: int) -> None:
    """Serve the bundled demo models (the same as `ortinf serve` with no package)."""
    ctx.invoke(serve, packages=(), host=host, port=port)


@cli.group()
def bench() -> None:
    """Benchmarks (see also the scripts in benchmarks/)."""


@bench.command("serve")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, help="Server base URL (without /v1).")
@click.option("--model", default=None, help="The `model` field to send [default: the server's language model].")
@click.option("--num-prompts", type=click.IntRange(min=1), default=64, show_default=True, help="Requests to send.")
@click.option("--input-len", type=click.IntRange(min=1), default=128, show_default=True, help="Prompt length in tokens (random ids).")
@click.option("--output-len", type=click.IntRange(min=1), default=128, show_default=True, help="Tokens to generate per request (ignore_eos).")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=8, show_default=True, help="Most requests in flight at once.")
@click.option("--request-rate", type=float, default=float("inf"), show_default=True, help="Poisson arrivals per second (inf: all at once).")
@click.option("--vocab-size", type=click.IntRange(min=4), default=1000, show_default=True, help="Prompt token ids are drawn below this.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random prompts and arrivals.")
@click.option("--api-key", envvar="ORTINF_API_KEY", default=None, help="Bearer key, if the server wants one.")
@click.option("--save-result", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Write the summary as JSON here.")
def bench_serve(url: str, model: str | None, num_prompts: int, input_len: int, output_len: int, max_concurrency: int,
                request_rate: float, vocab_size: int, seed: int, api_key: str | None, save_result: Path | None) -> None:
    """Stream requests at a running server; report throughput and TTFT/TPOT/ITL/E2E latency (mean, median, p99)."""
    import asyncio
    import json

    from ortinf.cli.bench import BenchConfig, format_summary, run_bench

    config = BenchConfig(url.rstrip("/"), model, num_prompts, input_len, output_len, max_concurrency, request_rate, vocab_size, seed, api_key)
    summary = asyncio.run(run_bench(config))
    click.echo(format_summary(summary))
    if save_result is not None:
        save_result.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if summary["completed"] == 0:
        raise click.ClickException(f"no request succeeded against {url}: {'; '.join(summary['errors']) or 'no response'}")


def main() -> None:
    """Console entry point (pyproject.toml): the CLI, with errors turned into one line (ortinf/cli/exit_codes.py)."""
    run(cli)
