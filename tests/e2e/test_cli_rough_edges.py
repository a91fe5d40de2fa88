"""The rough edges a new user hits first (issue 20, item 7): a busy port, first-use export logging,
progress bars in logs, the package cache's file modes, and sizes in the Python API."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ortinf
from ortinf.errors import ConfigError

ORTINF = str(Path(sys.executable).with_name("ortinf"))


def test_a_busy_port_is_refused_before_loading_anything(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        start = time.monotonic()
        done = subprocess.run([ORTINF, "serve", "--port", str(port)], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "ORTINF_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use (Address already in use): pass another --port, or stop what listens there"]
    assert not (tmp_path / "cache").exists() and time.monotonic() - start < 30  # nothing was exported or loaded


def test_export_logs_are_clean_and_the_package_is_readable(decoder_package, tmp_path):
    """Exported with stderr not a terminal: no nested-bar cursor escapes, and the package has the
    modes the umask gives (not the staging folder's 700 / temporary files' 600)."""
    _, package = decoder_package("llama")
    hf = package.parent / "hf"
    done = subprocess.run([ORTINF, "export", str(hf), "-o", str(tmp_path / "pkg")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "\x1b[A" not in done.stderr  # the nested bar (cursor up) is for terminals only
    mask = os.umask(0)
    os.umask(mask)
    root = tmp_path / "pkg"
    assert stat.S_IMODE(root.stat().st_mode) == 0o777 & ~mask
    for path in root.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o777 if path.is_dir() else 0o666) & ~mask, path


def test_first_use_export_is_not_a_warning(decoder_package, tmp_path):
    _, package = decoder_package("llama")
    done = subprocess.run([ORTINF, "generate", str(package.parent / "hf"), "--prompt-ids", "5,6", "-n", "2"], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "ORTINF_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr


def test_kv_cache_memory_takes_sizes_in_python_too(decoder_package):
    _, package = decoder_package("llama")
    llm = ortinf.LLM(package, kv_cache_memory="2MiB")
    assert llm.engine.config.kv_cache_memory == 2 * 2**20
    with pytest.raises(ConfigError, match="cannot read the size 'lots'"):
        ortinf.LLM(package, kv_cache_memory="lots")
    with pytest.raises(ConfigError, match="kv_cache_memory must be a positive number of bytes or a size such as 256MiB"):
        ortinf.LLM(package, kv_cache_memory=0)
