"""The linter the project is configured for (pyproject.toml [tool.ruff]: syntax errors, pyflakes' unused and
undefined names, lines up to 150 characters, import order) finds nothing in the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_module_docstrings_are_at_most_20_lines():
    """A module's docstring says what the module is for in a few lines and points at docs/ for the design (issue
    58): a longer explanation belongs in docs/."""
    import ast

    offenders = []
    for path in sorted((ROOT / "ortinf").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        lines = docstring.count("\n") + 1 if docstring else 0
        if lines > 20:
            offenders.append(f"{relative}: {lines} lines")
    assert not offenders, "module docstrings over 20 lines (move the design into docs/):\n" + "\n".join(offenders)
