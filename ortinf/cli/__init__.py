"""The `ortinf` command: one module per command (main.py holds the group and the smaller commands)."""

from ortinf.cli.main import cli, main

__all__ = ["cli", "main"]
