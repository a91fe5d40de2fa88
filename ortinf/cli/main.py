"""The `ortinf` command line: the group and its small commands (inspect, providers, matrix, demo); the others
have a module each in ortinf/cli/. User errors print one line and exit 2; they never show a traceback."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

import ortinf
from ortinf.cli.bench import bench
from ortinf.cli.chat import chat
from ortinf.cli.exit_codes import run
from ortinf.cli.export import export
from ortinf.cli.generate import generate
from ortinf.cli.serve import serve
from ortinf.cli.transcribe import transcribe
from ortinf.manifest import TEXT_GENERATION, Manifest


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(ortinf.__version__, "--version", "-V", prog_name="ortinf")
@click.option("-v", "--verbose", is_flag=True, help="Log what ortinf decides (provider, sizes, figures).")
def cli(verbose: bool) -> None:
    """ortinf: export Hugging Face models to ONNX packages and serve them on any ONNX Runtime provider."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


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
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port to listen on.")
@click.pass_context
def demo(ctx: click.Context, host: str, port: int) -> None:
    """Serve the bundled demo models (the same as `ortinf serve` with no package)."""
    ctx.invoke(serve, packages=(), host=host, port=port)


for command in (export, generate, chat, serve, transcribe, bench):  # one module per command (ortinf/cli/)
    cli.add_command(command)


def main() -> None:
    """Console entry point (pyproject.toml): the CLI, with errors turned into one line (ortinf/cli/exit_codes.py)."""
    run(cli)
