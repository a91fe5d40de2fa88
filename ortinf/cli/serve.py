"""`ortinf serve`: packages behind the OpenAI-compatible server. Its options are generated from the fields of
ServerConfig (the server's own: ortinf/serve/config.py) and EngineConfig (the engine's: ortinf/config.py) by
ortinf/cli/serve_options.py; only Ray's and the log level are written here."""

from __future__ import annotations

from pathlib import Path

import click

from ortinf import extras
from ortinf.cli.serve_options import check_port, engine_options, engine_values, load_yaml_config, server_options, server_values
from ortinf.errors import ConfigError
from ortinf.manifest import Manifest


@click.command()
@click.argument("packages", nargs=-1)
@click.option("--config", type=click.Path(path_type=Path, dir_okay=False), is_eager=True, expose_value=False,
              callback=load_yaml_config, help="YAML file of options (keys as the option names, e.g. port: 8000).")
@server_options()
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
@engine_options()
def serve(packages: tuple[Path, ...], use_ray: bool, num_replicas: int, min_replicas: int | None, max_replicas: int | None,
          target_ongoing_requests: float | None, cpus_per_replica: float, gpus_per_replica: float, prefix_routing: bool,
          log_level: str, **given: object) -> None:
    """Serve PACKAGES behind OpenAI-, Anthropic- and Ollama-compatible APIs: OpenAI's /v1/chat/completions,
    /v1/completions, /v1/responses, /v1/embeddings and /v1/models; Anthropic's Messages API (/v1/messages);
    Ollama's /api/chat, /api/generate, /api/embed, /api/tags and /api/ps.

    PACKAGES are folders made by `ortinf export`, or Hugging Face model folders, exported into the package
    cache (~/.cache/ortinf, or $ORTINF_CACHE) on first use and reused after. With no PACKAGES (and no
    --models-dir), serves the bundled demo language model and embedding model the same way. With
    --models-dir DIR, the models under DIR load on their first request and unload when idle or to make
    room (there every request must name its model). Requests are routed to a model by their `model` field.
    """
    from ortinf.config import EngineConfig
    from ortinf.serve.config import ServerConfig, model_names

    server = server_values(given)  # the server's options, as ServerConfig takes them (a bad size fails now, before models load)
    engine = engine_values(given)  # the engine's options, as EngineConfig takes them (both generated from their fields)
    served_model_names = server.pop("served_model_names")
    if not use_ray:
        check_port(server["host"], server["port"])  # before minutes of loading (or exporting) models, not after
    models_dir = server.get("models_dir")
    if models_dir is not None and not Path(models_dir).is_dir():
        raise click.UsageError(f"--models-dir {models_dir}: no such folder")
    on_demand = {"--max-loaded-models": server.get("max_loaded_models", 0) != 0, "--models-memory": server.get("models_memory") is not None,
                 "--idle-unload": server.get("idle_unload", 0.0) != 0.0, "--model-load-timeout": server.get("model_load_timeout", 120.0) != 120.0}
    needing = next((flag for flag, set_ in on_demand.items() if set_), None)
    if needing is not None and models_dir is None:
        raise click.UsageError(f"{needing} applies to --models-dir: add --models-dir DIR, or drop it")
    if models_dir is not None and (engine.get("lora_modules") or server.get("allow_runtime_lora_updates")):
        raise click.UsageError("LoRA adapters are served with the models given as PACKAGES, not with --models-dir")
    if not packages and models_dir is None:
        from ortinf.bundled import ensure_exported

        bundled = ensure_exported()
        packages = tuple(path for _, path in bundled)
        served_model_names = served_model_names or tuple(name for name, _ in bundled)
    else:
        from ortinf.bundled import resolve_package

        packages = tuple(resolve_package(p) for p in packages)  # a Hugging Face folder is exported into the cache once
    for package in packages:  # a wrong path or a broken package fails now, in one line, before the server starts
        manifest = Manifest.load(package)
        lacking = extras.needs("audio", f"serving {package} (a speech-recognition model)") if manifest.speech else None
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

    manifests = [Manifest.load(p) for p in packages]
    if models_dir is not None:  # the packages under it that read now (a broken one is an error for its own requests, later)
        from ortinf.serve.model_manager import discover

        manifests += [m for m in (_readable(entry.package) for entry in discover(Path(models_dir)).values()) if m is not None]
    if manifests:
        check_server_options(manifests, {k: v for k, v in engine.items() if k != "provider"})
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
    config = ServerConfig(packages=tuple(packages), served_model_names=served_model_names, engine_options=engine, **server)
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
    import logging

    from ortinf.serve import preload
    from ortinf.serve.config import engine_options as served_options

    logging.getLogger("ortinf").setLevel(log_level.upper())  # as server.run sets it: the preload logs at this level
    if len(packages) == 1 and models_dir is None and not (engine.get("lora_modules") or engine.get("max_loras")
                                                          or server.get("allow_runtime_lora_updates")):
        preload.start(packages[0], names[0], served_options(packages[0], config, False))
    from ortinf.serve.server import run  # FastAPI, the routes and uvicorn import while the package opens

    run(config, log_level)


def _readable(package: Path) -> Manifest | None:
    """A --models-dir package's manifest, None where there is none yet (a folder or GGUF not exported) or it is broken."""
    try:
        return Manifest.load(package)
    except Exception:  # noqa: BLE001 - any wrong shape (`[]`, `{"decoder": []}`): that model's requests get the error, not the start
        return None
