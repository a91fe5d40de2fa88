"""One weight file per package (docs/exporter.md, "One weight file"): a quantized package's CPU graph reads
model.onnx.data's MatMulNBits tensors (ortinf.QMatMul layout 1) and computes what the two-file form packages
had before issue 42 computes (the packed layout in model.cpu.onnx.data), bit for bit; that older form still loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from support.tiny_models import add_tokenizer, build_decoder

import ortinf
from ortinf.exporter import cpu_fusion
from ortinf.exporter.quantize import CPU_OP, Quantized, qmatmul_tensors
from ortinf.kernels import library
from ortinf.manifest import CPU_MODEL_NAME, WEIGHTS_NAME
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

pytestmark = pytest.mark.skipif(library.load() is None, reason="the kernel library is not built (python -m ortinf.kernels.build)")


def two_file_form(package: Path, out: Path) -> None:
    """`package` as the exporter wrote it before issue 42: every QMatMul reads its own packed weights (no `layout`
    attribute), stored in model.cpu.onnx.data, unpacked here from the MatMulNBits tensors it now shares."""
    shutil.copytree(package, out)
    cpu = onnx.load(str(out / CPU_MODEL_NAME), load_external_data=True)
    weights = {t.name: t for t in cpu.graph.initializer}
    added, used = [], set()
    for node in cpu.graph.node:
        if node.op_type != CPU_OP:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        k, n, bits, block = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
        b = numpy_helper.to_array(weights[node.input[1]]).reshape(n, -1)
        if bits == 4:  # element 2j in byte j's low nibble, 2j+1 in its high one
            b = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(n, -1)
        q = (b.astype(np.int16) - (1 << (bits - 1))).astype(np.int8).T
        scales = numpy_helper.to_array(weights[node.input[2]]).reshape(n, -1).T
        packed, packed_scales = qmatmul_tensors(Quantized(np.ascontiguousarray(q), np.ascontiguousarray(scales), bits, block, k))
        base = node.input[1].removesuffix(".B")
        added += [numpy_helper.from_array(packed, base + ".packed"), numpy_helper.from_array(packed_scales, base + ".old_scales")]
        used.update(node.input[1:3])
        node.input[1], node.input[2] = base + ".packed", base + ".old_scales"
        kept = [a for a in node.attribute if a.name != "layout"]
        del node.attribute[:]
        node.attribute.extend(kept)
    assert added, "the package has no QMatMul"
    others = [t for t in cpu.graph.initializer if t.name not in used]
    del cpu.graph.initializer[:]
    cpu.graph.initializer.extend(others + added)
    onnx.save_model(cpu, str(out / CPU_MODEL_NAME), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=CPU_MODEL_NAME + ".data", size_threshold=1024)


def unfused_form(package: Path, out: Path, undo=cpu_fusion.unfuse) -> int:
    """`package` with its CPU graph one QMatMul per weight (cpu_fusion.unfuse, or `undo`), its weights file hard-linked
    (ORT refuses external data outside the package folder); returns the nodes split."""
    shutil.copytree(package, out, ignore=shutil.ignore_patterns(WEIGHTS_NAME))
    (out / WEIGHTS_NAME).hardlink_to(package / WEIGHTS_NAME)
    cpu = onnx.load(str(out / CPU_MODEL_NAME), load_external_data=False)
    split = undo(cpu)
    assert split > 0
    onnx.save_model(cpu, str(out / CPU_MODEL_NAME))
    return split


def _logits(package: Path, tokens: list[int]) -> np.ndarray:
    graph = DecoderGraph(package, num_blocks=16, block_size=16, provider="cpu", cpu_kernel=True)
    return graph.run(build_model_input([SequenceChunk(tokens, 0, [3, 1, 4])], 16, [True]))


@pytest.mark.parametrize("dtype,in_memory", [("int8", False), ("int4", False), ("int4", True)])
def test_one_file_equals_the_two_file_form(tmp_path, dtype, in_memory):
    source = tmp_path / "hf"
    build_decoder("llama", source)
    add_tokenizer(source)
    package = tmp_path / "pkg"
    result = ortinf.export(source, package, dtype=dtype, progress=False, quality_gate="record", in_memory=in_memory)
    assert result.cpu_kernel is not None
    assert sorted(p.name for p in package.glob("*.data")) == [WEIGHTS_NAME]  # every graph over model.onnx.data
    cpu = onnx.load(str(package / CPU_MODEL_NAME), load_external_data=False)
    assert {e.value for t in cpu.graph.initializer for e in t.external_data if e.key == "location"} == {WEIGHTS_NAME}
    # the CPU graph's fused nodes (q/k/v in one, swiglu) run the same weights as one QMatMul per weight: equal but
    # for silu's exp (the kernel's own polynomial against ORT's Sigmoid) and what it moves in later rounding
    unfused, old = tmp_path / "unfused", tmp_path / "old"
    unfused_form(package, unfused)
    tokens = list(np.random.default_rng(1).integers(3, 250, 37))
    fused_logits, unfused_logits = _logits(package, tokens), _logits(unfused, tokens)
    assert np.abs(fused_logits - unfused_logits).max() <= 0.02 * np.abs(unfused_logits).max()
    two_file_form(unfused, old)
    assert (old / (CPU_MODEL_NAME + ".data")).stat().st_size > 0
    assert np.array_equal(unfused_logits, _logits(old, tokens))
