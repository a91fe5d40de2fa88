"""Whisper's two graphs (exporter/whisper.py) against transformers, step by step: the encoder's
cross-attention K/V written into pool blocks of their own, then a ragged batch of two requests (other
audio, other prompt lengths) prefilled and decoded through shuffled self-attention blocks."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import torch
import transformers

from ortinf.exporter.whisper import export_whisper_graphs
from ortinf.runtime.model_input import SequenceChunk, build_model_input

BLOCK = 4
HEADS, HEAD_DIM, LAYERS = 4, 16, 2


def tiny_whisper() -> transformers.WhisperForConditionalGeneration:
    config = transformers.WhisperConfig(vocab_size=256, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=LAYERS,
                                        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=128,
                                        decoder_ffn_dim=128, max_source_positions=32, max_target_positions=64, pad_token_id=0,
                                        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    model.config._attn_implementation = "eager"
    return model


def test_graphs_match_transformers_through_the_pool(tmp_path):
    model = tiny_whisper()
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

    pools = [np.zeros((HEADS, 64, BLOCK, HEAD_DIM), np.float32) for _ in range(2 * LAYERS)]
    order = rng.permutation(64).tolist()
    cross_tables = [order[0:8], order[8:16]]  # 32 positions = 8 blocks each, shuffled
    for request, table in enumerate(cross_tables):
        slots = np.array([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(32)])
        for index, pool in enumerate(pools):  # cross K/V of layer i go into layer i's pool
            pool.transpose(1, 2, 0, 3).reshape(-1, HEADS, HEAD_DIM)[slots] = cross[index][request]
    self_tables = [order[16:24], order[24:32]]
    tokens = [[1, 50, 60, 70, 80, 90, 11], [1, 33]]
    done = [0, 0]
    worst = 0.0
    for step in range(6):
        chunks = [SequenceChunk(t[d:], d, table) for t, d, table in zip(tokens, done, self_tables)]
        step_input = build_model_input(chunks, BLOCK)
        feeds = {k: v for k, v in step_input.feeds().items() if k != "slot_mapping"}
        feeds.update(cross_block_tables=np.array(cross_tables, np.int64), cross_lens=np.array([32, 32], np.int64))
        feeds.update({f"{kind}_cache.{i}": pools[2 * i + (kind == "value")] for i in range(LAYERS) for kind in ("key", "value")})
        logits, *new_kv = decoder.run(None, feeds)
        for index, pool in enumerate(pools):  # the host write of this step's self-attention K/V
            pool.transpose(1, 2, 0, 3).reshape(-1, HEADS, HEAD_DIM)[step_input.slot_mapping] = new_kv[index]
        for request in range(2):
            with torch.no_grad():
                ref = model(input_features=torch.from_numpy(features[request : request + 1]),
                            decoder_input_ids=torch.tensor([tokens[request]])).logits[0, -1].numpy()
            worst = max(worst, float(np.abs(logits[request] - ref).max()))
            done[request] = len(tokens[request])
            tokens[request].append(int(ref.argmax()))
    assert worst < 1e-4, worst
