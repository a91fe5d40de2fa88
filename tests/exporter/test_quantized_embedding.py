"""The token embedding at the weights' precision (issue 55, item 2; ortinf/exporter/quantize.py): an int8/int4
package gathers its embedding from quantized rows (com.microsoft.GatherBlockQuantized), a tied model's rows are its
LM head's own MatMulNBits bytes (written once, referenced by both), and the bundled demo (a trained model) passes
the quality gate so exported."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from support.tiny_models import add_tokenizer, build_decoder

import ortinf
from ortinf.bundled import DEMO_LLAMA
from ortinf.exporter.quantize import quantize_weight
from ortinf.manifest import CPU_MODEL_NAME, MODEL_NAME, WEIGHTS_NAME


def _graph(package: Path, name: str = MODEL_NAME) -> onnx.ModelProto:
    return onnx.load(str(package / name), load_external_data=False)


def _where(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    entry = {e.key: e.value for e in tensor.external_data}
    return entry["location"], int(entry["offset"]), int(entry["length"])


def _lookup(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type in ("Gather", "GatherBlockQuantized") and "embed" in n.name)


def _export(tmp_path: Path, model_type: str, dtype: str, **overrides) -> tuple[torch.nn.Module, Path]:
    model = build_decoder(model_type, tmp_path / "hf", **overrides)
    add_tokenizer(tmp_path / "hf")
    ortinf.export(tmp_path / "hf", tmp_path / "pkg", dtype=dtype, progress=False, quality_gate="record")
    return model, tmp_path / "pkg"


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_tied_embedding_is_its_lm_heads_bytes(tmp_path, dtype):
    """Gemma 2 ties its LM head to its embedding: both graphs gather from the LM head's B and scales (the same file
    region), and the package holds no fp32 table (it was more than the rest of the package together)."""
    model, package = _export(tmp_path, "gemma2", dtype, hidden_size=128)  # whole blocks of int8's 128
    vocab, hidden = model.get_input_embeddings().weight.shape
    for name in (MODEL_NAME, CPU_MODEL_NAME):
        graph = _graph(package, name)
        tensors = {t.name: t for t in graph.graph.initializer}
        lookup = _lookup(graph)
        assert lookup.op_type == "GatherBlockQuantized", name
        head = next(n for n in graph.graph.node if n.op_type in ("MatMulNBits", "QMatMul") and "lm_head" in n.input[1])
        assert _where(tensors[lookup.input[0]]) == _where(tensors[head.input[1]])  # rows = B
        assert _where(tensors[lookup.input[2]]) == _where(tensors[head.input[2]])  # row scales = scales
        assert not any(t.data_type == onnx.TensorProto.FLOAT and list(t.dims) == [vocab, hidden] for t in graph.graph.initializer)
    regions = {_where(t) for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    end = max(offset + length for _, offset, length in regions)
    assert (package / WEIGHTS_NAME).stat().st_size == end  # the file holds what the graphs reference, and nothing else
    assert sum(-(-length // 4096) * 4096 for _, _, length in regions) >= end - 4096  # each region once, page-aligned


def test_an_untied_embedding_is_quantized_on_its_own(tmp_path):
    """A llama's embedding is not its LM head: its rows are the embedding's own, quantized per row in blocks of hidden
    exactly as quantize_weight rounds the table (offset binary, low nibble first, as MatMulNBits' B)."""
    model, package = _export(tmp_path, "llama", "int4")
    assert not model.config.tie_word_embeddings
    graph = _graph(package)
    tensors = {t.name: t for t in graph.graph.initializer}
    lookup = _lookup(graph)
    assert lookup.op_type == "GatherBlockQuantized"
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in lookup.attribute}
    assert attributes["bits"] == 4 and attributes["gather_axis"] == 0 and attributes["quantize_axis"] == 1
    table = model.get_input_embeddings().weight.detach().numpy()
    expected = quantize_weight(np.ascontiguousarray(table.T), 4, attributes["block_size"]).dequantized().T
    rows = numpy_helper.to_array(tensors[lookup.input[0]], base_dir=str(package))
    scales = numpy_helper.to_array(tensors[lookup.input[2]], base_dir=str(package))
    codes = np.stack([rows & 0x0F, rows >> 4], axis=-1).reshape(len(rows), -1).astype(np.float32) - 8
    got = (codes.reshape(len(rows), scales.shape[1], -1) * scales[:, :, None]).reshape(len(rows), -1)
    np.testing.assert_array_equal(got, expected)
    heads = [n for n in graph.graph.node if n.op_type == "MatMulNBits"]
    assert all(_where(tensors[lookup.input[0]]) != _where(tensors[h.input[1]]) for h in heads)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_the_demo_passes_the_quality_gate_with_its_embedding_quantized(tmp_path, dtype):
    """The bundled demo is trained (its tied table carries meaning): exported with the gate enforced (top-1 agreement,
    mean KL and greedy agreement against transformers at fp32), measured with the quantized embedding."""
    manifest = ortinf.export(DEMO_LLAMA, tmp_path / "pkg", dtype=dtype, progress=False, quality_gate="enforce")
    assert _lookup(_graph(tmp_path / "pkg")).op_type == "GatherBlockQuantized"
    quality = manifest.quality
    assert quality.enforced and quality.top1_agreement >= quality.min_top1_agreement and quality.mean_kl <= quality.max_mean_kl
