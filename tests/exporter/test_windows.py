"""Verification in windows of layers (ortinf/exporter/windows.py): every layer checked against its PyTorch layer
with one window of weights loaded at a time, a wrong layer caught, and a verification peak that does not grow
with depth."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from support.tiny_models import add_tokenizer, build_decoder

import ortinf
from ortinf.exporter.source import resolve_model
from ortinf.exporter.streaming import reference_model, skeleton
from ortinf.exporter.verify import verify_decoder, verify_quality
from ortinf.exporter.windows import cut, decoder_layers, layer_bytes, plan
from ortinf.manifest import Manifest

ORTINF = str(Path(sys.executable).with_name("ortinf"))
LAYERS = {"gemma3_text": {}, "gpt2": {"n_layer": 4}}  # gemma3's tiny config lists 3 layer types


def _package(tmp_path: Path, model_type: str = "llama", dtype: str = "fp32") -> tuple[Path, Path]:
    source = tmp_path / "hf"
    build_decoder(model_type, source, **LAYERS.get(model_type, {"num_hidden_layers": 4}))
    add_tokenizer(source)
    ortinf.export(source, tmp_path / "pkg", dtype=dtype, progress=False, quality_gate="record")
    return source, tmp_path / "pkg"


def _reference(source: Path):
    return reference_model(skeleton(resolve_model(str(source))))


def test_windows_are_equal_runs_of_layers_within_the_budget():
    assert plan([10, 10, 10, 10], 40) == [(0, 4)]
    assert plan([10, 10, 10, 10], 39) == [(0, 2), (2, 4)]  # 3 fit, but equal runs: 2 + 2, not 3 + 1
    assert plan([10] * 28, 100) == [(0, 10), (10, 20), (20, 28)]
    assert plan([240] * 28, 2048) == [(0, 7), (7, 14), (14, 21), (21, 28)]  # 7B int8: 8 layers fit, 4 windows of 7
    assert plan([10] * 5, 1) == [(i, i + 1) for i in range(5)]  # never less than one layer


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "gemma3_text", "gpt2"])  # every parameter random per layer
def test_each_window_equals_pytorch_with_the_same_layers(tmp_path, model_type):
    """One layer per window: every window's logits match the PyTorch model cut to the same layers, on both graphs;
    no window package is left behind."""
    source, package = _package(tmp_path, model_type)
    reference = _reference(source)
    for cpu_kernel in (False, True):
        whole = verify_decoder(reference, package, 1e-3, progress=False, cpu_kernel=cpu_kernel)
        windowed = verify_decoder(reference, package, 1e-3, progress=False, cpu_kernel=cpu_kernel, budget=1)
        assert "windows" not in whole.description
        assert f"in {reference.config.num_hidden_layers} windows of layers" in windowed.description
        assert windowed.max_abs_diff < 1e-4 and whole.max_abs_diff < 1e-4
    owner, name = decoder_layers(reference)  # the reference is whole again
    assert len(getattr(owner, name)) == reference.config.num_hidden_layers == (3 if model_type == "gemma3_text" else 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "pkg"]


def test_a_wrong_layer_fails_its_window(tmp_path):
    """Layer 2's down_proj changed in the weight file: windowed verification fails as whole verification does."""
    source, package = _package(tmp_path)
    graph = onnx.load(str(package / "model.onnx"), load_external_data=False)
    tensor = next(t for t in graph.graph.initializer if "layers.2" in t.name and "down_proj" in t.name)
    entry = {e.key: e.value for e in tensor.external_data}
    with open(package / entry["location"], "r+b") as data:
        data.seek(int(entry["offset"]))
        data.write(np.full(16, 0.5, np.float32).tobytes())
    reference = _reference(source)
    assert verify_decoder(reference, package, 1e-3, progress=False).max_abs_diff > 1e-3
    assert verify_decoder(reference, package, 1e-3, progress=False, budget=1).max_abs_diff > 1e-3
    sizes = layer_bytes(graph.graph, "layers")
    assert len(sizes) == 4 and len(set(sizes)) == 1 and sizes[0] > 0


def test_quality_in_windows_is_the_worst_window(tmp_path):
    source, package = _package(tmp_path, dtype="int4")
    reference = _reference(source)
    whole = verify_quality(reference, package, "int4")
    windowed = verify_quality(reference, package, "int4", budget=1)
    assert "4 windows" in windowed.description and "windows" not in whole.description
    assert 0.0 < windowed.top1_agreement <= 1.0 and windowed.mean_kl > 0.0


def test_the_cli_verifies_in_windows_and_refuses_a_bad_size(tmp_path):
    source = tmp_path / "hf"
    build_decoder("llama", source, num_hidden_layers=4)
    add_tokenizer(source)
    done = subprocess.run([ORTINF, "export", str(source), "-o", str(tmp_path / "pkg"), "--dtype", "int8", "--verify-memory", "1",
                           "--quality-gate", "record", "-q"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = Manifest.load(tmp_path / "pkg")
    for description in (manifest.parity.description, manifest.cpu_kernel.description, manifest.quality.description):
        assert "in 4 windows of layers (0-0, 1-1, 2-2, 3-3" in description
    bad = subprocess.run([ORTINF, "export", str(source), "-o", str(tmp_path / "bad"), "--verify-memory", "lots"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "cannot read the size 'lots'" in bad.stderr and not (tmp_path / "bad").exists()


def test_a_window_graph_holds_only_its_layers_weights(tmp_path):
    """What bounds verification's memory: a window's graphs reference the embedding, the final norm, the LM head and
    their own layers' weights, nothing else, and read K/V from pools renumbered from 0."""
    _, package = _package(tmp_path, dtype="int4")
    for graph_file in ("model.onnx", "model.cpu.onnx"):
        model = onnx.load(str(package / graph_file), load_external_data=False)
        window = cut(model, 1, 3, "layers")
        layers = {int(m.group(1)) for t in window.graph.initializer for m in [re.search(r"layers\.(\d+)[./]", t.name)] if m}
        assert layers == {1, 2}
        shared = {t.name for t in model.graph.initializer if not re.search(r"layers\.\d+[./]", t.name)}
        assert shared <= {t.name for t in window.graph.initializer} | _unused(model)
        assert [i.name for i in window.graph.input if "cache" in i.name] == ["key_cache.0", "value_cache.0", "key_cache.1", "value_cache.1"]
        assert [o.name for o in window.graph.output] == ["logits", "key_cache_out.0", "value_cache_out.0", "key_cache_out.1", "value_cache_out.1"]
        known = {i.name for i in window.graph.input} | {t.name for t in window.graph.initializer} | {""}
        known |= {name for node in window.graph.node for name in node.output}
        assert all(name in known for node in window.graph.node for name in node.input)  # nothing dangles


def _unused(model: onnx.ModelProto) -> set[str]:
    read = {name for node in model.graph.node for name in node.input}
    return {t.name for t in model.graph.initializer if t.name not in read}
