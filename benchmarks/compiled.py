"""A benchmark's small C helper (a probe, never the kernel library): built with the system C compiler ($CC, else gcc)
once per source text into the temp folder, and loaded with ctypes."""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path
from shutil import which


def load_c(source: Path) -> ctypes.CDLL | None:
    """`source` built as a shared library and loaded; None without a C compiler or when it does not build."""
    text = source.read_bytes()
    target = Path(tempfile.gettempdir()) / f"ortinf_{source.stem}_{hashlib.sha256(text).hexdigest()[:12]}.so"
    if not target.exists():
        compiler = os.environ.get("CC", "gcc")
        if which(compiler) is None:
            return None
        partial = target.with_suffix(f".{os.getpid()}.tmp")  # built aside and renamed: parallel runs never load half a file
        done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-pthread", "-o", str(partial), str(source)],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            return None
        partial.replace(target)
    return ctypes.CDLL(str(target))
