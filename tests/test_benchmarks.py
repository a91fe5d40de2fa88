"""Every benchmark script runs, in its tiny mode (--tiny: a 2-layer model or the demo, a few requests),
so that none rots unnoticed (decode_step.py once stopped running when DecoderGraph changed). Each
must exit 0 and print its markdown table; none records anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"

# script -> extra arguments (beside --tiny); compare.py's int8/int4 rows are left to the real run
SCRIPTS = {
    "attention_kernels.py": [],
    "decode_step.py": ["--profile"],
    "export_llama.py": [],
    "offline.py": [],
    "serve.py": [],
    "structured_output.py": [],
    "speculative.py": [],
    "compare.py": ["--precisions", "fp32"],
    "ray_serve.py": [],
    "two_models.py": [],
    "package_forms.py": [],
    "output_path.py": [],
    "moe.py": [],
    "lora.py": [],
    "lora_layouts.py": [],
    "whisper.py": [],
    "whisper_front_end.py": [],
    "qmatmul.py": ["--repeats", "1"],
    "bandwidth.py": [],
    "peak.py": [],
    "kv_dtype.py": [],
    "onednn_matmul.py": ["--repeats", "1"],  # without benchmarks/peers/install_onednn.sh: ortinf's columns only
    "one_engine.py": [],  # issue 30's before/after: a worktree of the base revision beside this tree
    "beam_search.py": [],
    "gguf_parity.py": [],
    "vision.py": [],
    "export_memory.py": ["--in-memory", "--serve"],
    "graph_nodes.py": [],
    "encoder_batching.py": [],  # issue 44's before/after: a worktree of the base revision beside this tree
    "prefix_cache_disk.py": [],  # issue 45: a long prompt's TTFT across a restart, and --models-dir's swap
    "load.py": [],  # issue 55: load time and RSS, the packed store beside packing at load
}
# ray_serve.py starts Ray clusters (minutes); compare.py and moe.py take ~40 s each in tiny mode (peer subprocesses,
# MoE exports), export_memory.py and encoder_batching.py ~30 s (measured 34 and 28 s, 2026-11-27): in the slow run,
# which keeps the default suite near 20 minutes on 2 cores
SLOW = {"ray_serve.py", "compare.py", "moe.py", "export_memory.py", "encoder_batching.py"}


def test_every_script_is_covered():
    scripts = {p.name for p in BENCHMARKS.glob("*.py")} - {"record.py", "demo_tokenizer_models.py", "compiled.py"}  # helpers, not scripts
    assert scripts == set(SCRIPTS)


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in SCRIPTS])
def test_benchmark_runs_in_tiny_mode(script, tmp_path):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    extra = list(SCRIPTS[script])
    if script in ("compare.py", "speculative.py", "structured_output.py", "moe.py"):
        extra += ["--work-dir", str(tmp_path / "work")]
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--tiny", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "### " in done.stdout and "|---" in done.stdout, done.stdout[-2000:]
    assert "failed" not in done.stdout.split("###", 1)[1].lower(), done.stdout[-2000:]


def test_bandwidth_probe_reports_its_fastest_read_loop(monkeypatch):
    """benchmarks/bandwidth.py's figure (the roofline qmatmul.py and compare.py state shares against) is the best of its
    read loops at 2 threads, each loop's figure its best read; with a C compiler the compiled loops are among them."""
    import importlib.util
    import shutil

    spec = importlib.util.spec_from_file_location("bandwidth", BENCHMARKS / "bandwidth.py")
    bandwidth = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bandwidth", bandwidth)  # its dataclass looks its module up there
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # its C helper's builder, benchmarks/compiled.py
    spec.loader.exec_module(bandwidth)
    readings = bandwidth.probe((1, 2), mib=8, rounds=1)
    assert all(r.rates and min(r.rates) > 0 and r.best == max(r.rates) for r in readings)
    assert {r.threads for r in readings} == {1, 2}
    top = bandwidth.best(readings)
    assert top.threads == 2 and top.best == max(r.best for r in readings if r.threads == 2)
    if shutil.which("gcc"):
        assert bandwidth.KINDS[0] in {r.variant for r in readings}
    assert bandwidth.measure(2, mib=8, rounds=1) > 0
