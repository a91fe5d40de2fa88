"""Whisper's two graphs (ortinf/exporter/whisper.py) against transformers, step by step: the encoder's
cross-attention K/V written into pool blocks of their own, then a ragged batch of two requests (other
audio, other prompt lengths) prefilled and decoded through shuffled self-attention blocks."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
from support.tiny_models import build_whisper

from ortinf.exporter.whisper import export_whisper_graphs, step_through_pool

HEADS, HEAD_DIM, LAYERS = 4, 16, 2


def test_graphs_match_transformers_through_the_pool(tmp_path):
    model = build_whisper(max_source_positions=32)  # 64 feature frames: a short encoder
    export_whisper_graphs(model, tmp_path)
    encoder = ort.InferenceSession(str(tmp_path / "encoder.onnx"), providers=["CPUExecutionProvider"])
    decoder = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    features = rng.standard_normal((2, 80, 64)).astype(np.float32)
    cross = encoder.run(None, {"input_features": features})  # per layer K, V: [2, 32, H, D]
    with torch.no_grad():
        hf_cross = model.model.encoder(torch.from_numpy(features)).last_hidden_state
        want = model.model.decoder.layers[1].encoder_attn.v_proj(hf_cross).reshape(2, 32, HEADS, HEAD_DIM).numpy()
    assert np.abs(cross[3] - want).max() < 1e-4
    # a ragged batch: a 7-token and a 2-token prompt, other audio each, then greedy decode steps
    assert step_through_pool(encoder, decoder, model, features, [[1, 50, 60, 70, 80, 90, 11], [1, 33]], steps=6) < 1e-4


def test_ortinf_export_writes_a_verified_whisper_package(tmp_path):
    """`ortinf export` on a Whisper folder: both graphs, the mel filters (the model's own 128 here),
    the manifest with its parity, and the decoder graph with the in-graph KV write loads."""
    import ortinf
    from ortinf.manifest import Manifest

    build_whisper(tmp_path / "hf", num_mel_bins=128, max_source_positions=32)
    manifest = ortinf.export(tmp_path / "hf", tmp_path / "pkg", progress=False)
    assert manifest.task == "automatic-speech-recognition" and manifest.speech.num_mel_bins == 128
    assert manifest.parity.max_abs_diff < 1e-4 and Manifest.load(tmp_path / "pkg").speech.source_positions == 32
    filters = np.load(tmp_path / "pkg" / "mel_filters.npy")
    assert filters.shape == (201, 128)
    for name in ("encoder.onnx", "model.onnx", "model.host-write.onnx", "encoder.pool-write.onnx", "alignment.onnx"):
        assert (tmp_path / "pkg" / name).is_file()
    import onnx

    def locations(name: str) -> set[str]:  # where a graph's large weights live
        model = onnx.load(str(tmp_path / "pkg" / name), load_external_data=False)
        return {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}

    # one copy of each weight: the twins and the alignment graph point into the decoder's file, the
    # pool-writing encoder into the encoder's
    assert locations("alignment.onnx") == locations("model.host-write.onnx") == {"model.onnx.data"}
    assert locations("encoder.pool-write.onnx") == {"encoder.onnx.data"}
    assert not (tmp_path / "pkg" / "alignment.onnx.data").exists()
    if manifest.cpu_kernel is not None:  # the kernel library is built here
        assert locations("model.cpu.onnx") == {"model.onnx.data"} and manifest.cpu_kernel.max_abs_diff < 1e-4
    assert manifest.speech.alignment_heads and manifest.speech.encoder_write_graph == "encoder.pool-write.onnx"
    graph = ort.InferenceSession(str(tmp_path / "pkg" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert {"slot_mapping", "cross_block_tables", "cross_lens"} <= {i.name for i in graph.get_inputs()}
    from ortinf.cli.inspect_table import manifest_rows

    rows = dict(manifest_rows(Manifest.load(tmp_path / "pkg"), tmp_path / "pkg"))
    assert "128 mel bins" in rows["speech encoder"] and rows["task"] == "automatic-speech-recognition"


def test_int8_whisper_package(tmp_path):
    """--dtype int8: the encoder's and decoder's MatMuls as MatMulNBits, the quality figures against the
    fp32 model recorded (top-1 agreement and KL, teacher-forced), and the package transcribes."""
    import ortinf
    from ortinf.tasks.speech.transcriber import Transcriber

    build_whisper(tmp_path / "hf")
    manifest = ortinf.export(tmp_path / "hf", tmp_path / "pkg", dtype="int8", progress=False)
    assert manifest.dtype == "int8" and manifest.quantization.bits == 8
    assert manifest.quality.top1_agreement >= 0.9 and not manifest.quality.failures()
    import onnx

    ops = {n.op_type for n in onnx.load(str(tmp_path / "pkg" / "encoder.onnx"), load_external_data=False).graph.node}
    assert "MatMulNBits" in ops
    samples = (0.3 * np.random.default_rng(0).standard_normal(16000 * 3)).astype(np.float32)
    assert len(Transcriber(tmp_path / "pkg").transcribe_ids([samples], max_new_tokens=6)[0]) >= 1
