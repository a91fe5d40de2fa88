"""The serving side imports neither torch nor transformers (docs/architecture.md: an edge box installs only it)."""

from __future__ import annotations

import subprocess
import sys

SERVING_MODULES = [
    "ortinf",
    "ortinf.cli",
    "ortinf.manifest",
    "ortinf.inspect_table",
    "ortinf.runtime.decoder_graph",
    "ortinf.runtime.encoder_graph",
    "ortinf.runtime.model_input",
    "ortinf.runtime.kv_pool",
    "ortinf.providers.registry",
    "ortinf.providers.session",
    "ortinf.providers.table",
    "ortinf.runtime.engine",  # with structured output (llguidance) and speculative decoding
    "ortinf.serve.app",
    "ortinf.chat_cli",
]


def test_serving_modules_do_not_import_torch_or_transformers():
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in SERVING_MODULES)
        + "heavy = sorted(m for m in ('torch', 'transformers', 'optimum', 'ray') if m in sys.modules)\n"
        + "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"serving imports pulled in: {result.stdout.strip()}"
