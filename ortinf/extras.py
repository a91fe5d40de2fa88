"""The optional extras (pyproject.toml) and the command that installs one, from where ortinf was installed.

`pip install 'ortinf[audio]'` only works where ortinf comes from an index, and `pip install '.[audio]'` only
from the clone; `install_command` writes the command that works here: the extra's own requirements,
installed by this environment's pip."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shlex
import sys
from pathlib import Path

# Modules of the optional extras -> the extra that installs them. The serving install (`pip install ortinf`)
# has none of them.
EXTRA_MODULES = {"torch": "export", "transformers": "export", "optimum": "export", "onnx": "export", "onnx_ir": "export",
                 "safetensors": "export", "huggingface_hub": "export", "gguf": "export", "ray": "ray", "soundfile": "audio", "soxr": "audio",
                 "multipart": "audio", "PIL": "vision"}


def missing(extra: str) -> list[str]:
    """The modules of `extra` this environment cannot import."""
    return [name for name, owner in EXTRA_MODULES.items() if owner == extra and importlib.util.find_spec(name) is None]


def install_command(extra: str) -> str:
    """The command that installs `extra` into this environment: its requirements as ortinf's metadata lists
    them, by this interpreter's pip (never ortinf itself again: a provider's environment installs ortinf
    without its dependencies, and reinstalling it would bring the stock onnxruntime back), pinned by the
    clone's constraints.txt when ortinf runs from a clone."""
    pip = f"{shlex.quote(sys.executable)} -m pip install"
    try:
        distribution = importlib.metadata.distribution("ortinf")
        requirements = [r.split(";")[0].strip() for r in distribution.requires or []
                        if re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", r)]
    except importlib.metadata.PackageNotFoundError:
        requirements = []
    if not requirements:
        return f"{pip} 'ortinf[{extra}]'"
    constraints = Path(__file__).resolve().parents[1] / "constraints.txt"  # ortinf runs from a clone (editable install)
    pinned = f"-c {shlex.quote(str(constraints))} " if constraints.is_file() else ""
    # PyPI's Linux torch is the CUDA build (gigabytes of nvidia-* wheels): the CPU build comes from PyTorch's index
    cpu_torch = "--extra-index-url https://download.pytorch.org/whl/cpu " if sys.platform == "linux" and any(
        re.match(r"torch\b", r) for r in requirements) else ""
    return f"{pip} {pinned}{cpu_torch}{' '.join(shlex.quote(r) for r in requirements)}"


def needs(extra: str, what: str) -> str | None:
    """One line saying that `what` needs `extra` and how to install it, or None when it is installed."""
    lacking = missing(extra)
    if not lacking:
        return None
    names = ", ".join({"multipart": "python-multipart", "PIL": "pillow"}.get(name, name) for name in lacking)
    return f"{what} needs ortinf's '{extra}' extra ({names} not installed): {install_command(extra)}"
