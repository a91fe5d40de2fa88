"""The `ortinf` command line in this process: the `ortinf` group with the console script's exit handling
(ortinf/cli/exit_codes.py) under click's CliRunner isolation, answered as subprocess.run would answer. For --help,
--version and user errors, which end before any model loads; a real subprocess per command stays in the tests that
run one (the console script, signals, logging to stderr)."""

from __future__ import annotations

import logging
import subprocess
import sys

from click.testing import CliRunner


def ortinf_in_process(*args: object, env: dict[str, str] | None = None,
                      input: str | None = None) -> subprocess.CompletedProcess[str]:  # noqa: A002 - subprocess.run's name
    """Runs `ortinf ARGS` here: its exit code, stdout and stderr (as text)."""
    from ortinf.cli.exit_codes import run
    from ortinf.cli.main import cli

    class AsInstalled:  # the group under the console script's name (click would name it after `python -m pytest`)
        def main(self, **kwargs):
            return cli.main(prog_name="ortinf", **kwargs)

    argv = ["ortinf", *map(str, args)]
    saved = sys.argv
    with CliRunner().isolation(input=input, env=env) as (out, err, _):
        # what the command's logging.basicConfig gives a real process (pytest's handlers make it a no-op here): warnings
        # on stderr, so that an assertion of one line on stderr sees them as it would in a terminal
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
        sys.argv = argv
        try:
            run(AsInstalled())
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv = saved
            logging.getLogger().removeHandler(handler)
    return subprocess.CompletedProcess(argv, code, out.getvalue().decode(), err.getvalue().decode())
