"""The serving-only install (`pip install ortinf`, no torch): a command that needs an extra says which,
in one line, exit code 2. Run in .venv-openvino (a real serving-only environment: scripts/install.sh
makes it) and, everywhere, in this environment with the export modules made unimportable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVING_ONLY = ROOT / ".venv-openvino" / "bin" / "ortinf"
EXPECTED = ("error: this command needs ortinf's 'export' extra (torch is not installed): pip install 'ortinf[export]' "
            "(in a clone: pip install -c constraints.txt '.[export]')")


@pytest.mark.skipif(not SERVING_ONLY.exists(), reason=".venv-openvino (scripts/setup_openvino_env.sh) is not installed")
def test_export_in_a_serving_only_environment(tmp_path):
    done = subprocess.run([str(SERVING_ONLY), "export", str(ROOT / "ortinf" / "assets" / "demo-llama"), "-o", str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == EXPECTED, done.stderr
    assert not (tmp_path / "p").exists()


def test_export_without_torch_is_one_line(tmp_path):
    code = ("import sys; sys.modules['torch'] = None; sys.argv = ['ortinf', 'export', sys.argv[1], '-o', sys.argv[2]]; "
            "from ortinf.cli import main; main()")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "ortinf" / "assets" / "demo-llama"), str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [EXPECTED]
