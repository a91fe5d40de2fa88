"""The kernel library as the runtime meets it: it loads into the pinned onnxruntime, the exporter
writes and verifies the CPU graph, the runtime picks it on the CPU provider, and a library that is
missing or broken falls back to the portable graph with one log line, never a crash; a package
that must have it refuses clearly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import pytest

from ortinf.errors import ConfigError
from ortinf.kernels import library
from ortinf.manifest import CPU_MODEL_NAME, Manifest
from ortinf.runtime.worker.decoder_graph import DecoderGraph

needs_library = pytest.mark.skipif(library.load() is None, reason="the kernel library is not built")

# Runs in a fresh interpreter (the library's load() is cached per process): builds a DecoderGraph
# on the CPU and prints which kernel it runs, with ortinf's warnings on stderr.
PROBE = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from ortinf.runtime.worker.decoder_graph import DecoderGraph
graph = DecoderGraph(sys.argv[1], num_blocks=16, block_size=16, provider="cpu")
print(graph.kernel_description)
"""


def probe(package, env_value: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ}
    env.pop(library.ENV_PATH, None)
    if env_value is not None:
        env[library.ENV_PATH] = env_value
    return subprocess.run([sys.executable, "-c", PROBE, str(package)], env=env, capture_output=True, text=True, timeout=120)


@needs_library
def test_export_writes_a_verified_cpu_graph_that_shares_the_weights(decoder_package):
    _, package = decoder_package("llama")
    manifest = Manifest.load(package)
    kernel = manifest.cpu_kernel
    assert kernel is not None and kernel.graph == CPU_MODEL_NAME and kernel.domain == library.DOMAIN
    assert 0 <= kernel.max_abs_diff <= 1e-3 and "ortinf.PagedAttention" in kernel.description
    graph = onnx.load(str(package / CPU_MODEL_NAME), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("PagedAttention") == manifest.decoder.num_layers
    assert "Softmax" not in ops and "ScatterND" not in ops  # no portable attention left, and the op writes the pool
    writes = sorted(out for n in graph.node if n.op_type == "PagedAttention" for out in n.output[4:6])
    assert writes == sorted(o.name for o in graph.output if "cache_out" in o.name) and len(writes) == 2 * manifest.decoder.num_layers
    # every weight lives in the shared model.onnx.data, none is duplicated inside the graph file
    big = [t for t in graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL and len(t.raw_data) >= 1024]
    assert not big and (package / CPU_MODEL_NAME).stat().st_size < (package / "model.onnx.data").stat().st_size / 4
    assert json.loads((package / "ortinf.json").read_text())["cpu_kernel"]["ops"] == ["PagedAttention"]


@needs_library
def test_runtime_picks_the_cpu_graph_and_falls_back_when_the_library_is_missing_or_broken(decoder_package, tmp_path):
    _, package = decoder_package("llama")
    found = probe(package, None)
    assert found.returncode == 0 and found.stdout.startswith("ortinf.PagedAttention (avx"), found.stderr
    missing = probe(package, str(tmp_path / "nowhere.so"))
    assert missing.returncode == 0 and missing.stdout.strip() == "portable"
    assert "CPU kernel library is not built" in missing.stderr and "portable kernel" in missing.stderr
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"not a shared library")
    broken = probe(package, str(garbage))
    assert broken.returncode == 0 and broken.stdout.strip() == "portable" and "does not load" in broken.stderr
    off = probe(package, "off")
    assert off.returncode == 0 and off.stdout.strip() == "portable"


def test_a_package_that_must_have_the_library_refuses_clearly(decoder_package, tmp_path):
    _, package = decoder_package("llama")
    env = {**os.environ, library.ENV_PATH: "off"}
    code = ("import sys\nfrom ortinf.runtime.worker.decoder_graph import DecoderGraph\nfrom ortinf.errors import ConfigError\n"
            "try:\n    DecoderGraph(sys.argv[1], num_blocks=16, block_size=16, provider='cpu', cpu_kernel=True)\n"
            "except ConfigError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(package)], env=env, capture_output=True, text=True, timeout=120)
    assert "needs ortinf's kernel library" in done.stdout and "python -m ortinf.kernels.build" in done.stdout


def test_cpu_kernel_on_a_package_without_the_graph_refuses(tmp_path, decoder_package):
    _, package = decoder_package("llama")
    copy = tmp_path / "old"
    copy.mkdir()
    for path in package.iterdir():
        if path.name != CPU_MODEL_NAME:
            (copy / path.name).symlink_to(path)
    data = json.loads((package / "ortinf.json").read_text())
    data["cpu_kernel"] = None
    (copy / "ortinf.json").unlink()
    (copy / "ortinf.json").write_text(json.dumps(data))
    assert DecoderGraph(copy, num_blocks=16, block_size=16, provider="cpu").kernel_description == "portable"
    with pytest.raises(ConfigError, match="has no graph for ortinf's CPU kernel library"):
        DecoderGraph(copy, num_blocks=16, block_size=16, provider="cpu", cpu_kernel=True)


def test_every_source_file_is_a_unit_the_build_compiles():
    """register.cc's "units:" line and the ISA tables name every .cc in the folder (a file left out would be an op the
    library silently lacks), and each unit named there exists."""
    from ortinf.kernels import build

    units = set(build.library_units())
    for isa in build.ISA_FLAGS:
        units |= {f"attention_{isa}", f"panel_gemm_{isa}"}
    units |= {f"qmatmul_{isa}" for isa in build.QMATMUL_ISA_FLAGS} | {"panel_gemm_avx512bf16"}
    files = {path.stem for path in build.SOURCES.glob("*.cc")}
    assert files == units, f"in the folder, not built: {sorted(files - units)}; named, no file: {sorted(units - files)}"
    assert "register" in build.library_units()
