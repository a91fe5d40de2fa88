"""The `ortinf serve` command's option machinery: options generated from EngineConfig, --config
files, and the listening-address check that runs before any model loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from ortinf.errors import ConfigError

# Engine options a command does not take, because it cannot use them: one stream (generate, chat: --seed
# is the request's there), or a speech model (no speculative decoding, no LoRA).
SINGLE_STREAM_EXCLUDED = frozenset({"seed", "max_num_seqs", "lora_modules", "max_loras", "max_lora_rank"})
SPEECH_EXCLUDED = frozenset({"speculative_config", "lora_modules", "max_loras", "max_lora_rank"})


def engine_fields(exclude: frozenset[str] = frozenset()) -> list:
    """EngineConfig's fields, each a CLI option (ortinf/config.py `option`), less `exclude`."""
    from ortinf.config import EngineConfig

    return [f for f in dataclasses.fields(EngineConfig) if "cli" in f.metadata and f.name not in exclude]


def engine_options(exclude: frozenset[str] = frozenset()):  # noqa: ANN201 - a click decorator factory
    """Adds one option per EngineConfig field (but `exclude`), generated from the field: its name
    (`--max-num-seqs`), type, default, help and section, an environment variable ORTINF_<NAME>. Every
    command that builds an engine (serve, generate, chat, transcribe) takes them the same way, and
    `engine_values` turns what was given into EngineConfig's keyword arguments."""

    def decorate(command):  # noqa: ANN001, ANN202
        for spec in reversed(engine_fields(exclude)):
            meta = spec.metadata
            flag = meta.get("flag") or "--" + spec.name.replace("_", "-")
            common = dict(envvar="ORTINF_" + spec.name.upper(), help=f"[{meta['section']}] {meta['cli']}")
            default = None if spec.default is dataclasses.MISSING else spec.default
            if "choices" in meta:
                word = next(k for k, v in meta["choices"].items() if v == default)
                option = click.option(flag, spec.name, type=click.Choice(list(meta["choices"])), default=word, show_default=True, **common)
            elif isinstance(default, bool):
                option = click.option(f"{flag}/--no-{flag[2:]}", spec.name, default=default, show_default=True, **common)
            elif meta.get("multiple"):
                option = click.option(flag, spec.name, multiple=True, metavar=meta.get("metavar"), **common)
            elif isinstance(default, int) or (str(spec.type).startswith("int") and "str" not in str(spec.type)):
                option = click.option(flag, spec.name, type=click.IntRange(min=meta.get("minimum", 1)), default=default,
                                      show_default=default is not None, **common)
            else:
                option = click.option(flag, spec.name, default=default, show_default=default is not None, metavar=meta.get("metavar"),
                                      **common)
            command = option(command)
        return command

    return decorate


def engine_values(given: dict) -> dict:
    """The engine options among a command's keyword arguments, as EngineConfig keyword arguments: choices
    mapped to their values, repeated options parsed (ConfigError says what is wrong)."""
    values = {}
    for spec in engine_fields():
        if spec.name not in given:
            continue
        value, meta = given[spec.name], spec.metadata
        if "choices" in meta:
            value = meta["choices"][value]
        elif meta.get("multiple"):
            value = meta["parse"](value)
        values[spec.name] = value
    return values


def split_engine_values(given: dict) -> tuple[dict, dict]:
    """(EngineConfig keyword arguments, the command's other arguments) of a command's keyword arguments."""
    names = {spec.name for spec in engine_fields()}
    return engine_values(given), {k: v for k, v in given.items() if k not in names}


def check_port(host: str, port: int) -> None:
    """Refuses, in one line, a host that does not resolve or a port something already listens on."""
    import socket

    if port == 0:
        return
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on --host {host}: {exc.strerror}") from exc
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a port in TIME_WAIT is free
        try:
            probe.bind(address)
        except OSError as exc:
            raise ConfigError(f"port {port} on {host} is in use ({exc.strerror}): pass another --port, "
                                   "or stop what listens there") from exc


def load_yaml_config(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    """--config FILE: its keys (option names, e.g. port, api_key, packages) become the defaults, so
    the command line and environment variables still win."""
    if value is None or ctx.resilient_parsing:
        return
    import yaml

    try:
        data = yaml.safe_load(Path(value).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise click.BadParameter(f"cannot read {value}: {exc}", param_hint="--config") from exc
    if not isinstance(data, dict):
        raise click.BadParameter(f"{value} must hold a mapping of option names to values", param_hint="--config")
    known = {p.name for p in ctx.command.params if p.name}
    unknown = sorted(set(data) - known)
    if unknown:
        raise click.BadParameter(f"unknown keys in {value}: {', '.join(unknown)}", param_hint="--config")
    ctx.default_map = {**(ctx.default_map or {}), **data}
