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


SETUP_SCRIPTS = {  # script -> (wheel it pins, platform its dry run resolves for)
    "setup_cuda_env.sh": ("onnxruntime-gpu[cuda,cudnn]==1.31.1", "this machine"),
    "setup_migraphx_env.sh": ("onnxruntime-migraphx==1.27.1", "this machine"),
    "setup_directml_env.sh": ("onnxruntime-directml==1.24.4", "win_amd64"),
    "setup_openvino_env.sh": ("onnxruntime-openvino==1.24.1", "this machine"),
}


@pytest.mark.parametrize("script", sorted(SETUP_SCRIPTS))
def test_provider_setup_scripts_dry_run(script):
    """Each GPU/accelerator environment script resolves its pinned wheel with pip (dry run: nothing is
    installed), into an environment of its own, with the serving dependencies but not onnxruntime."""
    wheel, platform = SETUP_SCRIPTS[script]
    done = subprocess.run(["bash", str(ROOT / "scripts" / script), "--dry-run"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    name = script.removeprefix("setup_").removesuffix("_env.sh").replace("directml", "dml")
    assert f"would create .venv-{name}" in done.stdout
    installs = next(line for line in done.stdout.splitlines() if line.startswith("would install into it:")).split()[4:]
    assert installs[0] == wheel and "fastapi>=0.110" in installs and not any(i.startswith("onnxruntime>") for i in installs)
    assert f"pip resolves {wheel} for {platform}: ok" in done.stdout


def test_directml_script_refuses_off_windows():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "setup_directml_env.sh")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == (
        "setup_directml_env.sh: DirectML runs on Windows only; run this from Git Bash on Windows (or pass --dry-run)")
    usage = subprocess.run(["bash", str(ROOT / "scripts" / "setup_provider_env.sh")], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: scripts/setup_provider_env.sh NAME REQUIREMENT")
