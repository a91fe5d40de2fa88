"""The `ortinf serve` command's option machinery: options generated from EngineConfig, --config
files, and the listening-address check that runs before any model loads."""

from __future__ import annotations

from pathlib import Path

import click

from ortinf.errors import ConfigError

ENGINE_PREFIX = "engine_"


def engine_options(command):  # noqa: ANN001, ANN201 - a click decorator
    """Adds one option per EngineConfig field that carries a "cli" help text (ortinf/config.py), so an
    engine setting becomes a server option by being declared once: `--block-size`, `--max-model-len`,
    `--seed`, `--num-blocks`, `--enable-prefix-caching/--no-enable-prefix-caching`."""
    import dataclasses

    from ortinf.config import EngineConfig

    for spec in reversed(dataclasses.fields(EngineConfig)):
        help_text = spec.metadata.get("cli")
        if help_text is None:
            continue
        flag = "--" + spec.name.replace("_", "-")
        envvar = "ORTINF_" + spec.name.upper()
        dest = ENGINE_PREFIX + spec.name
        if isinstance(spec.default, bool):
            option = click.option(f"{flag}/--no-{flag[2:]}", dest, default=spec.default, show_default=True, envvar=envvar, help=help_text)
        else:
            option = click.option(flag, dest, type=click.IntRange(min=0 if spec.name in ("seed", "max_loras") else 1), default=spec.default,
                                  show_default=spec.default is not None, envvar=envvar, help=help_text)
        command = option(command)
    return command


def parse_lora_modules(values: tuple[str, ...]) -> dict[str, str]:
    """--lora-modules NAME=PATH ... -> {name: path}; a malformed or repeated NAME is a usage error."""
    modules: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise click.UsageError(f"--lora-modules takes NAME=PATH (a PEFT adapter folder), got {value!r}")
        if name in modules:
            raise click.UsageError(f"--lora-modules names '{name}' twice")
        if not Path(path).expanduser().is_dir():
            raise click.UsageError(f"--lora-modules {name}: {path} is not a folder (pass a PEFT adapter folder)")
        modules[name.strip()] = str(Path(path).expanduser())
    return modules


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
