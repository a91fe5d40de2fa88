"""scripts/install.sh's torch resolver (scripts/torch_cpu.py): the CPU install never picks a CUDA build
of torch, whatever pip it runs under: this machine's configured pip, and an isolated pip (a plain
package index, where Linux torch is the CUDA build)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESOLVER = ROOT / "scripts" / "torch_cpu.py"


def pin() -> str:
    return next(line.strip() for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("torch=="))


def resolved_packages(args: list[str], isolated: bool, tmp_path: Path) -> list[str]:
    """What `pip install <args> torch==X` would install, dependencies included (a dry run)."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", *(["--isolated"] if isolated else []), "install", "--dry-run", "--quiet",
               "--ignore-installed", "--report", str(report), *args, pin()]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    return [f"{e['metadata']['name']} {e['metadata']['version']}" for e in json.loads(report.read_text())["install"]]


@pytest.mark.parametrize("isolated", [False, True], ids=["configured pip", "isolated pip"])
def test_cpu_install_never_resolves_a_cuda_torch(isolated, tmp_path):
    done = subprocess.run([sys.executable, str(RESOLVER), *(["--isolated"] if isolated else [])],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        # a refusal must say what to do, in one message, and the resolver installs nothing itself
        assert "ORTINF_TORCH_INDEX" in done.stderr and "CPU build of torch" in done.stderr, done.stderr
        return
    args = done.stdout.split()
    assert args in ([], ["--index-url", args[-1] if args else ""]), done.stdout
    packages = resolved_packages(args, isolated, tmp_path)
    torch = next(p for p in packages if p.lower().startswith("torch "))
    assert not any(p.lower().startswith(("nvidia-", "triton ")) for p in packages), packages
    assert "+cu" not in torch, torch


def test_install_script_uses_the_resolver():
    script = (ROOT / "scripts" / "install.sh").read_text()
    assert "scripts/torch_cpu.py" in script and " -q " not in script  # progress, not two silent minutes
