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


def engine_options(exclude: frozenset[str] = frozenset()):  # a click decorator factory
    """Adds one option per EngineConfig field (but `exclude`), generated from the field: its name
    (`--max-num-seqs`), type, default, help and section, an environment variable ORTINF_<NAME>. Every
    command that builds an engine (serve, generate, chat, transcribe) takes them the same way, and
    `engine_values` turns what was given into EngineConfig's keyword arguments."""
    return fields_as_options(engine_fields(exclude), sections=True)


def server_fields() -> list:
    """ServerConfig's fields, each a CLI option of `ortinf serve` (ortinf/serve/config.py)."""
    from ortinf.serve.config import ServerConfig

    return [f for f in dataclasses.fields(ServerConfig) if "cli" in f.metadata]


def server_options():  # a click decorator
    """Adds one option per ServerConfig field, generated from it as the engine's are."""
    return fields_as_options(server_fields(), sections=False)


def fields_as_options(specs: list, sections: bool):  # a click decorator factory
    """One click option per dataclass field declared with `ortinf.config.option`: the flag (`--max-num-seqs`, or
    metadata `flag`), the type from the default (bool: a --x/--no-x pair; int: a range from `minimum`/`maximum`;
    float: the same; `choices`: a choice of words; `multiple`: repeatable), the default (`shown` when the field's
    default is the parsed form of a text, e.g. 2MiB), the help (with its [section]) and ORTINF_<NAME>."""

    def decorate(command):
        for spec in reversed(specs):
            meta = spec.metadata
            flag = meta.get("flag") or "--" + spec.name.replace("_", "-")
            text = f"[{meta['section']}] {meta['cli']}" if sections else meta["cli"]
            common = dict(envvar="ORTINF_" + spec.name.upper(), help=text)
            default = None if spec.default is dataclasses.MISSING else spec.default
            if "shown" in meta:
                option = click.option(flag, spec.name, default=meta["shown"], show_default=True, metavar=meta.get("metavar"), **common)
            elif "choices" in meta:
                word = next(k for k, v in meta["choices"].items() if v == default)
                option = click.option(flag, spec.name, type=click.Choice(list(meta["choices"])), default=word, show_default=True, **common)
            elif isinstance(default, bool):
                option = click.option(f"{flag}/--no-{flag[2:]}", spec.name, default=default, show_default=True, **common)
            elif meta.get("multiple"):
                option = click.option(flag, spec.name, multiple=True, metavar=meta.get("metavar"), **common)
            elif isinstance(default, float):
                option = click.option(flag, spec.name, type=click.FloatRange(min=meta.get("minimum"), max=meta.get("maximum")),
                                      default=default, show_default=True, **common)
            elif isinstance(default, int) or (str(spec.type).startswith("int") and "str" not in str(spec.type)):
                option = click.option(flag, spec.name, type=click.IntRange(min=meta.get("minimum", 1), max=meta.get("maximum")),
                                      default=default, show_default=default is not None, **common)
            else:
                option = click.option(flag, spec.name, default=default, show_default=default is not None, metavar=meta.get("metavar"),
                                      **common)
            command = option(command)
        return command

    return decorate


def server_values(given: dict) -> dict:
    """ServerConfig's keyword arguments from a command's keyword arguments: each option's text parsed into the
    field's value (`parse`: a size into bytes, image=N into N, comma-separated hosts into a tuple)."""
    return field_values(server_fields(), given)


def engine_values(given: dict) -> dict:
    """The engine options among a command's keyword arguments, as EngineConfig keyword arguments: choices
    mapped to their values, repeated options parsed (ConfigError says what is wrong)."""
    return field_values(engine_fields(), given)


def field_values(specs: list, given: dict) -> dict:
    """The given options of `specs` (fields declared with `ortinf.config.option`) as the fields' values: a choice's
    word mapped to its value, the text parsed where the field says how (`parse`)."""
    values = {}
    for spec in specs:
        if spec.name not in given:
            continue
        value, meta = given[spec.name], spec.metadata
        if "choices" in meta:
            value = meta["choices"][value]
        if "parse" in meta and value is not None:
            value = meta["parse"](value)
        values[spec.name] = value
    return values


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
    except OSError as exc:
        raise click.BadParameter(f"cannot read {value}: {exc.strerror or exc}", param_hint="--config") from exc
    except yaml.YAMLError as exc:  # one line: what is wrong and where, not the parser's excerpt with carets
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise click.BadParameter(f"{value} is not valid YAML{where}: {problem}", param_hint="--config") from exc
    if not isinstance(data, dict):
        raise click.BadParameter(f"{value} must hold a mapping of option names to values", param_hint="--config")
    known = {p.name for p in ctx.command.params if p.name}
    unknown = sorted(set(data) - known)
    if unknown:
        raise click.BadParameter(f"unknown keys in {value}: {', '.join(unknown)}", param_hint="--config")
    ctx.default_map = {**(ctx.default_map or {}), **data}
