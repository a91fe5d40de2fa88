"""`ortinf serve`: packages behind the OpenAI-compatible server; its engine options are generated from
EngineConfig (ortinf/cli/serve_options.py), the server's own are written here."""

from __future__ import annotations

from pathlib import Path

import click

from ortinf import extras
from ortinf.cli.serve_options import check_port, engine_options, engine_values, load_yaml_config
from ortinf.errors import ConfigError
from ortinf.manifest import Manifest
from ortinf.tasks.chat.reasoning import PARSERS as REASONING_PARSERS
from ortinf.tasks.chat.tool_parsers import PARSERS


@click.command()
@click.argument("packages", nargs=-1)
@click.option("--config", type=click.Path(path_type=Path, dir_okay=False), is_eager=True, expose_value=False,
              callback=load_yaml_config, help="YAML file of options (keys as the option names, e.g. port: 8000).")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="ORTINF_HOST", help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, envvar="ORTINF_PORT",
              help="Port to listen on (1-65535).")
@click.option("--served-model-name", "served_model_names", multiple=True, envvar="ORTINF_SERVED_MODEL_NAME",
              help="Name clients use in `model` (one per package) [default: the package folder's name].")
@click.option("--api-key", envvar="ORTINF_API_KEY",
              help="Require `Authorization: Bearer KEY` on every route but /health, /version, /load and /metrics.")
@click.option("--max-queued-requests", type=click.IntRange(min=0), default=256, show_default=True, envvar="ORTINF_MAX_QUEUED_REQUESTS",
              help="Requests that may wait beyond the running batch; past that the server answers 429.")
@click.option("--shutdown-timeout", type=click.FloatRange(min=0.0), default=30.0, show_default=True, envvar="ORTINF_SHUTDOWN_TIMEOUT",
              help="On SIGTERM, seconds to let in-flight requests finish.")
@click.option("--max-body-size", default="2MiB", show_default=True, envvar="ORTINF_MAX_BODY_SIZE",
              help="Largest request body accepted (413 beyond), on every route but the audio uploads (--max-audio-body-size).")
@click.option("--max-audio-body-size", default="26MiB", show_default=True, envvar="ORTINF_MAX_AUDIO_BODY_SIZE",
              help="Largest body of /v1/audio/transcriptions and /v1/audio/translations (413 beyond): the audio file "
                   "(OpenAI's limit is 25 MiB) and its form fields.")
@click.option("--responses-store-size", default="256MiB", show_default=True, envvar="ORTINF_RESPONSES_STORE_SIZE",
              help="Memory for stored /v1/responses responses (GET and previous_response_id): the newest that fit stay, the "
                   "oldest go first; 0 stores none.")
@click.option("--limit-mm-per-prompt", default="image=8", show_default=True, envvar="ORTINF_LIMIT_MM_PER_PROMPT",
              help="Images a conversation may hold on a vision-language model: image=N (vLLM's form; JSON {\"image\": N} too); "
                   "more is a 400.")
@click.option("--allowed-media-domains", multiple=True, envvar="ORTINF_ALLOWED_MEDIA_DOMAINS",
              help="Hosts whose http(s) image URLs the server fetches, on ports 80/443 unless written host:port (repeat, or "
                   "separate with commas; redirects are held to them) [default: none: images come inline as data URLs].")
@click.option("--media-fetch-timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              envvar="ORTINF_MEDIA_FETCH_TIMEOUT",
              help="Seconds an image URL's fetch may take in all, redirects and a slow sender included (a 400 beyond).")
@click.option("--tool-call-parser", type=click.Choice(["auto", *PARSERS, "none"]), default="auto", show_default=True,
              envvar="ORTINF_TOOL_CALL_PARSER",
              help="How tool calls are read from a model's text for tool_choice 'auto': hermes (<tool_call>{json}</tool_call>: "
                   "Qwen, Hermes), llama3_json (Llama 3.x), mistral ([TOOL_CALLS]), granite (<|tool_call|>), none, or auto (the "
                   "one whose markers the chat template writes; a model with none answers tool_choice auto as plain text).")
@click.option("--reasoning-parser", type=click.Choice(["none", "auto", *REASONING_PARSERS]), default="none", show_default=True,
              envvar="ORTINF_REASONING_PARSER",
              help="Split a reasoning model's thinking into message.reasoning_content (vLLM's field): qwen3 (<think>...</think>, "
                   "Qwen3, QwQ), deepseek_r1 (the template opens <think>: DeepSeek-R1 and its distills), gpt_oss (harmony's "
                   "analysis and final channels), or auto (from the chat template's <think> or <|channel|>).")
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
          max_queued_requests: int, shutdown_timeout: float, max_body_size: str, max_audio_body_size: str, responses_store_size: str,
          limit_mm_per_prompt: str,
          allowed_media_domains: tuple[str, ...], media_fetch_timeout: float, tool_call_parser: str, reasoning_parser: str,
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
    from ortinf.tasks.chat.media import parse_limit_mm_per_prompt

    images_per_prompt = parse_limit_mm_per_prompt(limit_mm_per_prompt)  # a bad value fails now, before models load
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
        lacking = (extras.needs("audio", f"serving {package} (a speech-recognition model)") if manifest.speech else
                   extras.needs("vision", f"serving {package} (a vision-language model)") if manifest.vision else None)
        if lacking:  # this install serves every other kind; this one needs the extra named, from where ortinf came
            raise ConfigError(lacking)
        spec = manifest.decoder or manifest.encoder
        if manifest.has_tokenizer and spec is not None:
            from ortinf.tokenizer import load_checked_tokenizer

            load_checked_tokenizer(package, spec.vocab_size)
    from ortinf.providers.base import DEVICE
    from ortinf.providers.registry import resolve

    found = resolve(engine["provider"])  # a missing provider fails now, in one line
    checked = EngineConfig(package_dir=Path("."), **engine)  # so do a bad size, --speculative-config or --lora-modules
    spec = checked.speculative_config  # parsed once, here; the engines take the parsed config
    if spec is not None and spec.model is not None:  # and a draft model that is not there (a Hugging Face folder is exported)
        from dataclasses import replace

        from ortinf.bundled import resolve_package

        draft = resolve_package(Path(spec.model))
        Manifest.load(draft)
        spec = replace(spec, model=str(draft))
    engine["speculative_config"] = spec
    from dataclasses import replace as with_fields

    from ortinf.runtime.worker.kv_pool import check_budget
    from ortinf.tasks.package import check_server_options

    check_server_options([Manifest.load(p) for p in packages], {k: v for k, v in engine.items() if k != "provider"})
    for package in packages:  # a context or KV budget a decoder can never run with: one line now, not after the URL
        manifest = Manifest.load(package)
        if manifest.decoder is not None and manifest.seq2seq is None and manifest.speech is None:
            kinds = [manifest.decoder] + ([with_fields(manifest.decoder, kv_dtype=manifest.cpu_kernel.kv_dtype)]
                                          if manifest.cpu_kernel is not None and manifest.cpu_kernel.kv_dtype else [])
            check_budget(checked, kinds)
    if found.provider.memory == DEVICE and checked.kv_cache_memory is None and checked.num_blocks is None \
            and any(Manifest.load(p).decoder for p in packages):
        raise click.UsageError(f"the {found.provider.name} provider keeps the KV cache in device memory, whose free size ORT "
                               "does not report: pass --kv-cache-memory (e.g. 2GiB)")
    if served_model_names and len(served_model_names) != len(packages):
        raise click.UsageError(f"pass one --served-model-name per package ({len(packages)}), or none")
    config = ServerConfig(
        packages=tuple(packages), host=host, port=port, served_model_names=served_model_names, api_key=api_key,
        max_queued_requests=max_queued_requests, shutdown_timeout=shutdown_timeout, max_body_size=parse_size(max_body_size),
        max_audio_body_size=parse_size(max_audio_body_size), responses_store_size=parse_size(responses_store_size),
        tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser,
        metrics_prefix=metrics_prefix, limit_mm_per_prompt=images_per_prompt,
        allowed_media_domains=tuple(d.strip() for given in allowed_media_domains for d in given.split(",") if d.strip()),
        media_fetch_timeout=media_fetch_timeout,
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
