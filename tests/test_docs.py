"""The docs name only CLI options that exist: every `ortinf <command> --option` in README.md and docs/
(usage blocks, command lines in code, inline code) is an option of that command, and every option
written alone in inline code (`--kv-dtype fp16`) is an option of some ortinf command or of a script
the docs name. Docs link the repository's own architecture document, never ../shared."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click

from ortinf.cli import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
COMMAND = re.compile(r"(?:^|\s|/)(?<!from )ortinf ((?:bench )?(?!import\b)[a-z]+)\b(.*)")


def commands() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
            return
        options = {"--help"}
        for param in command.params:
            if isinstance(param, click.Option):
                options.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
        found[" ".join(path)] = options

    walk(cli, [])
    return found


def command_lines(text: str) -> list[tuple[str, str]]:
    """(command, rest of the line) for every `ortinf <command> ...` in code: fenced blocks (with their
    indented continuation lines) and inline code spans."""
    lines = []
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    for block in fenced:
        current = None
        for line in block.splitlines():
            match = COMMAND.search(line)
            if match:
                current = match.group(1)
                lines.append((current, match.group(2)))
            elif current and line.startswith(" "):
                lines.append((current, line))
            else:
                current = None
    for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
        match = COMMAND.search(span)
        if match:
            lines.append((match.group(1), match.group(2)))
    return lines


def test_every_documented_option_of_a_command_exists():
    known = commands()
    wrong = []
    for doc in DOCS:
        for command, rest in command_lines(doc.read_text(encoding="utf-8")):
            name = command if command in known else command.split()[0]
            if name not in known:
                if name in ("bench",):
                    continue
                wrong.append(f"{doc.name}: `ortinf {command}` is not a command")
                continue
            for option in OPTION.findall(rest):
                if option not in known[name]:
                    wrong.append(f"{doc.name}: ortinf {name} has no {option}")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_docs_link_the_repository_architecture_document():
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        assert "../shared" not in text, f"{doc.name} links ../shared (not in a clone): link docs/architecture.md"
    assert (ROOT / "docs" / "architecture.md").is_file()
    assert "docs/architecture.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def script_options() -> set[str]:
    """Options of the scripts the docs also describe (benchmarks/, scripts/, ortinf/kernels/build.py)."""
    found: set[str] = set()
    for path in [*ROOT.joinpath("benchmarks").rglob("*.py"), *ROOT.joinpath("scripts").glob("*"), ROOT / "ortinf" / "kernels" / "build.py"]:
        text = path.read_text(encoding="utf-8", errors="ignore")
        found |= set(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", text))
        if path.suffix == ".sh":
            found |= set(OPTION.findall(text))
    return found


def tools_options() -> set[str]:
    """The options of pytest (with this suite's plugins) and coverage, which docs/testing.md names."""
    found: set[str] = set()
    for command in ([sys.executable, "-m", "pytest", "--help"], [sys.executable, "-m", "coverage", "help", "run"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
        found |= set(OPTION.findall(done.stdout))
    return found


def agent_cli_options() -> dict[str, set[str] | None]:
    """The options of the agent CLIs the docs show commands of (scripts/setup_agent_clis.sh installs them where node is
    present): their --help and their exec's; None where one is not installed (its commands then go unchecked)."""
    found: dict[str, set[str] | None] = {}
    for name in ("claude", "codex"):
        binary = ROOT / ".tools" / "agent-clis" / "node_modules" / ".bin" / name
        if not binary.exists():
            found[name] = None
            continue
        found[name] = set()
        for command in ([str(binary), "--help"], [str(binary), "exec", "--help"] if name == "codex" else None):
            if command is not None:
                found[name] |= set(OPTION.findall(subprocess.run(command, capture_output=True, text=True, timeout=120).stdout))
    return found


def test_every_option_written_alone_exists_somewhere():
    known = set().union(*commands().values()) | script_options() | {"--dry-run", "--isolated", "--no-deps"}  # pip's
    known |= tools_options()
    agents = agent_cli_options()
    wrong = []
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        for span in re.findall(r"`([^`\n]+)`", text):
            if COMMAND.search(span):
                continue  # checked against its own command above
            agent = span.split()[0] if span.split() and span.split()[0] in agents else None
            if agent is not None:
                wrong += [f"{doc.name}: {option} (in `{span}`)" for option in OPTION.findall(span)
                          if agents[agent] is not None and option not in agents[agent]]
                continue
            wrong += [f"{doc.name}: {option} (in `{span}`)" for option in OPTION.findall(span) if option not in known]
    assert not wrong, "no such option:\n" + "\n".join(sorted(set(wrong)))


def test_readme_quality_figures_are_what_the_demo_measures(tmp_path):
    """The README's int8/int4 figures for the trained demo llama (issue 31, item 10: they had gone stale) are a range
    over the CPU kinds measured; this CPU's figures fall inside it (a new CPU kind outside it means the README needs
    its figures). Greedy agreement means something on trained weights: int8 keeps most greedy tokens."""
    import ortinf
    from ortinf.bundled import DEMO_LLAMA

    readme = " ".join((ROOT / "README.md").read_text().split())
    quoted = re.search(r"int8 top-1 ([0-9.]+)-([0-9.]+) \(greedy agreement ([0-9.]+)-([0-9.]+)\), int4 top-1 ([0-9.]+)-([0-9.]+) "
                       r"\(greedy ([0-9.]+)-([0-9.]+)\)", readme)
    assert quoted, "README.md no longer quotes the demo llama's int8/int4 figures in the form this test reads"
    bounds = [float(x) for x in quoted.groups()]
    for dtype, (low, high, greedy_low, greedy_high) in (("int8", bounds[:4]), ("int4", bounds[4:])):
        quality = ortinf.export(DEMO_LLAMA, tmp_path / dtype, dtype=dtype, progress=False).quality
        print(f"demo llama {dtype}: top-1 {quality.top1_agreement:.3f}, KL {quality.mean_kl:.4f}, greedy {quality.greedy_agreement:.3f}")
        assert low - 0.01 <= quality.top1_agreement <= high + 0.01, (dtype, quality.top1_agreement)
        assert greedy_low - 0.05 <= quality.greedy_agreement <= greedy_high + 0.05, (dtype, quality.greedy_agreement)
        if dtype == "int8":
            assert quality.mean_kl <= 0.005 and quality.greedy_agreement >= 0.5


def test_the_readme_synopsis_names_every_option():
    """Every option of every command (its long or short flag) is in the README's synopsis: it fell behind `--help`
    (export --vision-dtype, chat --image, five serve options)."""
    import re

    import click

    from ortinf.cli.main import cli

    readme = (ROOT / "README.md").read_text()
    start = readme.index("```text\nortinf serve")
    block = readme[start : readme.index("```", start + 8)]
    missing = []

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])
            return
        for param in command.params:
            flags = [f for f in (*param.opts, *param.secondary_opts) if f.startswith("-")] if isinstance(param, click.Option) else []
            if flags and not param.hidden and not any(re.search(re.escape(f) + r"(?![\w-])", block) for f in flags):
                missing.append(f"ortinf {' '.join(path)} {flags[0]}")

    walk(cli, [])
    assert not missing, "options missing from the README's synopsis: " + ", ".join(missing)
