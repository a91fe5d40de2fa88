"""How the `ortinf` command ends: the exit codes and the one-line messages for user errors."""

from __future__ import annotations

import errno
import sys
from typing import NoReturn

import click

from ortinf.errors import OrtinfError
from ortinf.extras import EXTRA_MODULES, install_command

EXIT_USER_ERROR = 2


def run(cli: click.Group) -> NoReturn:
    """Runs `cli` and exits: a bad option or value, ortinf's errors, a missing extra and a write that failed for
    space become one line and exit code 2, Ctrl-C 130; anything else is a bug and keeps its traceback."""
    try:
        code = cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:  # a bad option or value: one line, what to change and where the options are listed
        where = f" (`{exc.ctx.command_path} --help` lists the options)" if exc.ctx is not None else ""
        click.echo(f"error: {exc.format_message()}{where}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except OrtinfError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USER_ERROR)
    except ModuleNotFoundError as exc:
        extra = EXTRA_MODULES.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        click.echo(f"error: this command needs ortinf's '{extra}' extra ({exc.name} is not installed): {install_command(extra)}",
                   err=True)
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except OSError as exc:  # a full disk (or a file-size limit) while writing: one line, not a traceback
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        click.echo(f"error: {exc.strerror}{where}: free some space or write somewhere else (nothing was kept)", err=True)
        sys.exit(EXIT_USER_ERROR)
    sys.exit(code if isinstance(code, int) else 0)
