"""How to install the CPU build of the pinned torch here: the resolver step of scripts/install.sh.

usage: python scripts/torch_cpu.py [--pip PIP] [--isolated] [--index URL]

On PyPI, Linux `torch==X` is the CUDA build: it pulls the CUDA toolkit, cuDNN and NCCL wheels (gigabytes
that a CPU inference runtime never uses). So:

1. PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu, or ORTINF_TORCH_INDEX / --index)
   when it answers within a few seconds: torch comes from there.
2. Otherwise what this machine's pip is configured with (its index, find-links, mirrors), but only after
   a dry run (`pip install --dry-run --report`) shows that the wheel it would choose is a CPU build
   (no nvidia-* / triton requirements, or a `+cpu` local version).
3. Otherwise it refuses, saying what to do, and installs nothing.

Prints one line of pip arguments for the torch install (empty: the configured pip as it is) and exits
0, or prints the reason to stderr and exits 1. `--isolated` runs the dry run with `pip --isolated`
(no config files, no PIP_* variables: a plain package index), as the tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA_REQUIREMENT = re.compile(r"^(nvidia-|triton\b|cuda-)", re.IGNORECASE)


def pinned_torch() -> str:
    """The torch pin of constraints.txt (e.g. `torch==2.13.0`)."""
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if re.match(r"^torch\s*==", line.strip()):
            return line.strip()
    raise SystemExit("constraints.txt pins no torch version")


def index_reachable(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/torch/", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def dry_run(pip: list[str], requirement: str, isolated: bool) -> dict:
    """The wheel pip would install for `requirement` (without its dependencies): the report's entry."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [*pip, *(["--isolated"] if isolated else []), "install", "--dry-run", "--quiet", "--no-deps",
                   "--ignore-installed", "--report", str(report), requirement]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not report.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise LookupError(f"pip cannot resolve {requirement} here: {tail[0]}")
        installs = json.loads(report.read_text(encoding="utf-8")).get("install", [])
    if not installs:
        raise LookupError(f"pip chose no wheel for {requirement}")
    return installs[0]


def is_cuda_build(entry: dict) -> bool:
    metadata = entry.get("metadata", {})
    version = metadata.get("version", "")
    if "+cpu" in version:
        return False
    requires = metadata.get("requires_dist", []) or []
    return "+cu" in version or any(CUDA_REQUIREMENT.match(r.strip()) for r in requires)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pip", default=f"{sys.executable} -m pip", help="the pip to ask (default: this Python's)")
    parser.add_argument("--isolated", action="store_true", help="dry-run with pip --isolated (a plain package index)")
    parser.add_argument("--index", default=os.environ.get("ORTINF_TORCH_INDEX", CPU_INDEX), help="PyTorch's CPU wheel index")
    args = parser.parse_args()
    requirement = pinned_torch()
    if index_reachable(args.index):
        print(f"--index-url {args.index}")
        return 0
    try:
        entry = dry_run(args.pip.split(), requirement, args.isolated)
    except LookupError as err:
        print(f"{err}; PyTorch's CPU index ({args.index}) is not reachable either. Set ORTINF_TORCH_INDEX to a "
              "mirror of it, or install a CPU build of torch into .venv first", file=sys.stderr)
        return 1
    version = entry.get("metadata", {}).get("version", "?")
    if is_cuda_build(entry):
        print(f"{requirement} resolves to a CUDA build here (torch {version}, which pulls the nvidia-* wheels, gigabytes "
              f"unused on a CPU), and PyTorch's CPU index ({args.index}) is not reachable: set ORTINF_TORCH_INDEX to a "
              "mirror of it, or install a CPU build of torch into .venv first", file=sys.stderr)
        return 1
    print("")  # the configured pip already picks a CPU build (a local +cpu wheel, or a platform without CUDA builds)
    print(f"torch {version} from this machine's pip configuration (a CPU build)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
