"""Provider selection on ORT's device API: auto, explicit, missing, CPU fallback refused and allowed,
options, and `ortinf providers`. Real ONNX Runtime sessions throughout."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ortinf.errors import ConfigError, ProviderUnavailableError
from ortinf.providers.registry import parse_options, resolve
from ortinf.providers.session import create_session

ORTINF = str(Path(sys.executable).with_name("ortinf"))
ROOT = Path(__file__).resolve().parents[2]


def tiny_graph(path: Path, ops: list[str]) -> Path:
    """x [2, 2] through `ops` in a chain (Einsum transposes; Det is one op WebGPU lacks)."""
    nodes, name = [], "x"
    for i, op in enumerate(ops):
        attrs = {"equation": "ij->ji"} if op == "Einsum" else {}
        nodes.append(helper.make_node(op, [name], [f"t{i}"], **attrs))
        name = f"t{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_auto_picks_cpu_here_and_says_why(caplog):
    with caplog.at_level(logging.INFO):
        assert resolve("auto").provider.name == "cpu"
    assert "provider auto -> cpu" in caplog.text


def test_auto_skips_a_software_adapter(webgpu, caplog):
    assert webgpu.software  # lavapipe: a CPU device behind a GPU-style provider
    with caplog.at_level(logging.INFO):
        assert resolve("auto").provider.name == "cpu"
    assert "skipping webgpu (its only device is a software adapter)" in caplog.text


def test_missing_and_unknown_providers_name_what_to_install():
    with pytest.raises(ProviderUnavailableError, match=r"not installed in this environment: bash scripts/setup_cuda_env.sh \(onnxruntime-gpu "
                                                        r"replaces onnxruntime: its own .venv-cuda; CUDA 13, cuDNN 9\)$"):
        resolve("cuda")
    with pytest.raises(ProviderUnavailableError, match="unknown provider 'tpu': choose one of auto, cuda"):
        resolve("tpu")


def test_cpu_fallback_is_refused_unless_allowed(webgpu, tmp_path, caplog):
    model = tiny_graph(tmp_path / "det.onnx", ["Det"])
    with pytest.raises(ProviderUnavailableError, match="runs none of the graph .*pass --allow-cpu-fallback"):
        create_session(model, webgpu)
    with caplog.at_level(logging.WARNING):
        session, placement = create_session(model, webgpu, allow_cpu_fallback=True)
    assert placement.nodes == {"CPUExecutionProvider": 1} and "running on the CPU (--allow-cpu-fallback)" in caplog.text
    x = np.array([[2.0, 1.0], [1.0, 3.0]], np.float32)
    assert session.run(None, {"x": x})[0] == pytest.approx(5.0)


def test_partial_fallback_names_the_compute_ops(webgpu, tmp_path, caplog):
    model = tiny_graph(tmp_path / "mixed.onnx", ["Einsum", "Det"])
    with caplog.at_level(logging.WARNING):
        _, placement = create_session(model, webgpu)
    assert placement.nodes == {"WebGpuExecutionProvider": 1, "CPUExecutionProvider": 1}
    assert "webgpu does not run these compute ops, which run on the CPU instead: Det x1" in caplog.text


def test_provider_options():
    assert parse_options(["device_type=GPU", " precision = FP16 ", "cache_dir=/a=b"]) == {
        "device_type": "GPU", "precision": "FP16", "cache_dir": "/a=b"}
    for bad in ("device_type", "=GPU"):
        with pytest.raises(ConfigError, match="is not key=value"):
            parse_options([bad])


def test_providers_command_lists_devices_and_packages(webgpu):
    out = subprocess.run([ORTINF, "providers"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    table, _, kernel_line = out.stdout.partition("\n\n")
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert kernel_line.startswith("cpu attention kernel: ")
    assert out.stdout.splitlines()[0].split() == ["provider", "status", "devices", "pool", "dtypes", "kernels", "install"]
    assert "available (auto)" in rows["cpu"] and "host" in rows["cpu"]
    assert "available (software device)" in rows["webgpu"] and "device" in rows["webgpu"]
    assert rows["cuda"].endswith("bash scripts/setup_cuda_env.sh (onnxruntime-gpu replaces onnxruntime: its own .venv-cuda; "
                                 "CUDA 13, cuDNN 9)") and "not installed" in rows["cuda"]
    assert "bash scripts/setup_migraphx_env.sh" in rows["migraphx"] and "ROCm 7" in rows["migraphx"]
    if (ROOT / ".venv-openvino" / "bin" / "ortinf").exists():  # install.sh made it: the row says where OpenVINO runs
        assert rows["openvino"].split()[1:3] == ["in", ".venv-openvino"]
        assert rows["openvino"].endswith("it runs in .venv-openvino, made by its setup script: .venv-openvino/bin/ortinf ... "
                                         "--provider openvino")
    else:
        assert rows["openvino"].endswith("bash scripts/setup_openvino_env.sh (onnxruntime-openvino replaces onnxruntime: "
                                         "its own .venv-openvino)")


def test_cli_reports_a_missing_provider_in_one_line(decoder_package):
    _, package = decoder_package("llama")
    out = subprocess.run([ORTINF, "generate", str(package), "--prompt-ids", "1,2", "--provider", "cuda"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: provider 'cuda' is not installed in this environment: bash scripts/setup_cuda_env.sh "
        "(onnxruntime-gpu replaces onnxruntime: its own .venv-cuda; CUDA 13, cuDNN 9)")


def test_serve_refuses_before_starting(webgpu, decoder_package):
    """A missing provider, or a device pool without a size, fails in one line before the server starts."""
    _, package = decoder_package("llama")
    missing = subprocess.run([ORTINF, "serve", str(package), "--provider", "dml"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.strip() == (
        "error: provider 'dml' is not installed in this environment: bash scripts/setup_directml_env.sh (Windows; onnxruntime-directml replaces "
        "onnxruntime: its own .venv-dml)")
    unsized = subprocess.run([ORTINF, "serve", str(package), "--provider", "webgpu"], capture_output=True, text=True, timeout=120)
    assert unsized.returncode == 2 and "keeps the KV cache in device memory" in unsized.stderr and "--kv-cache-memory" in unsized.stderr


def test_install_hints_name_what_a_pip_user_has(monkeypatch):
    """From a clone the hint is the clone's setup script; from PyPI (no scripts/ beside the package) it is the pip
    command, never a script the user does not have."""
    import pathlib

    from ortinf.providers import openvino, webgpu

    assert openvino.PROVIDER.install_hint.startswith("bash scripts/setup_openvino_env.sh")
    monkeypatch.setattr(pathlib.Path, "is_dir", lambda self: False)
    for provider in (openvino.PROVIDER, webgpu.PROVIDER):
        assert "scripts/" not in provider.install_hint and "pip install" in provider.install_hint
    assert "onnxruntime-openvino" in openvino.PROVIDER.install_hint
