"""Whisper's alignment graph, for word timing (ortinf/tasks/speech/word_timing.py): the alignment heads' cross-attention
weights of one window's tokens, traced from the decoder, and its check against transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ortinf.exporter.tracing import OPSET, quiet_tracing


class WhisperAlignmentGraph(torch.nn.Module):
    """For word timing (ortinf/tasks/speech/word_timing.py): one window's tokens through the decoder, unpaged, with
    the cross K/V read back from the window's pool blocks, returning the alignment heads' cross-attention
    weights. Run once per kept window, not per step.

        input_ids [T], cross_key.{i} / cross_value.{i} [heads, source_positions, head_dim] per layer
        up to the last alignment layer -> weights [alignment heads, T, source_positions]"""

    def __init__(self, model: torch.nn.Module, heads: list[tuple[int, int]]) -> None:
        super().__init__()
        self.decoder = model.model.decoder
        self.d_model = model.config.d_model
        self.alignment = heads
        self.heads = model.config.decoder_attention_heads
        self.head_dim = model.config.d_model // self.heads

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # [1, T, H*D] -> [H, T, D]
        return x.reshape(-1, self.heads, self.head_dim).transpose(0, 1)

    def forward(self, input_ids: torch.Tensor, *cross: torch.Tensor) -> torch.Tensor:
        # the decoder layers written out (transformers' decoder builds its causal mask with vmap, which
        # does not trace); only as far as the last alignment layer
        count = input_ids.shape[0]
        # [1, T, d_model], as the paged decoder's: its linears then trace to the same MatMul weights, which
        # the package stores once (Gemm on 2-d input would keep them untransposed, a second copy)
        hidden = (self.decoder.embed_tokens(input_ids) + self.decoder.embed_positions.weight[:count])[None]
        future = torch.triu(torch.ones(count, count, dtype=torch.bool), diagonal=1)
        kept = {}
        for index, layer in enumerate(self.decoder.layers[: max(layer for layer, _ in self.alignment) + 1]):
            attention = layer.self_attn
            x = layer.self_attn_layer_norm(hidden)
            q, k, v = self._heads(attention.q_proj(x) * attention.scaling), self._heads(attention.k_proj(x)), self._heads(attention.v_proj(x))
            scores = torch.matmul(q, k.transpose(1, 2)).masked_fill(future, torch.finfo(hidden.dtype).min)
            out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(0, 1).reshape(1, count, -1)
            hidden = hidden + attention.out_proj(out)
            attention = layer.encoder_attn
            q = self._heads(attention.q_proj(layer.encoder_attn_layer_norm(hidden)) * attention.scaling)
            weights = torch.softmax(torch.matmul(q, cross[2 * index].transpose(1, 2)), dim=-1)  # [H, T, S]
            kept[index] = weights
            hidden = hidden + attention.out_proj(torch.matmul(weights, cross[2 * index + 1]).transpose(0, 1).reshape(1, count, -1))
            hidden = hidden + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))
        return torch.stack([kept[layer][head] for layer, head in self.alignment])


def alignment_heads(model: torch.nn.Module) -> list[tuple[int, int]]:
    """The generation config's alignment heads, else openai-whisper's default: every head of the
    second half of the decoder layers."""
    found = getattr(model.generation_config, "alignment_heads", None)
    if found:
        return [(int(layer), int(head)) for layer, head in found]
    layers, heads = model.config.decoder_layers, model.config.decoder_attention_heads
    return [(layer, head) for layer in range(layers // 2, layers) for head in range(heads)]


def export_alignment_graph(model: torch.nn.Module, heads: list[tuple[int, int]], path: Path) -> None:
    config = model.config
    count, width = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
    names = [f"cross_{kind}.{i}" for i in range(max(layer for layer, _ in heads) + 1) for kind in ("key", "value")]
    cross = [torch.randn(count, config.max_source_positions, width) for _ in names]
    with torch.no_grad(), quiet_tracing():
        torch.onnx.export(WhisperAlignmentGraph(model, heads).eval(), (torch.tensor([1, 5, 7]), *cross), str(path), dynamo=False,
                          input_names=["input_ids", *names], output_names=["weights"],
                          dynamic_axes={"input_ids": {0: "tokens"}, "weights": {1: "tokens"}}, opset_version=OPSET)


def check_alignment(encoder: object, aligner: object, model: torch.nn.Module, features: np.ndarray, tokens: list[int],
                    heads: list[tuple[int, int]]) -> float:
    """Max abs difference of the alignment graph's weights from transformers' cross-attentions."""
    cross = encoder.run(None, {"input_features": features})
    wanted = {i.name for i in aligner.get_inputs()}
    feeds = {"input_ids": np.array(tokens, dtype=np.int64)}
    for index, value in enumerate(cross):
        name = f"cross_{'key' if index % 2 == 0 else 'value'}.{index // 2}"
        if name in wanted:
            feeds[name] = np.ascontiguousarray(value[0].transpose(1, 0, 2))  # [S, H, D] -> the pool's [H, S, D]
    ours = aligner.run(None, feeds)[0]
    with torch.no_grad():
        out = model(input_features=torch.from_numpy(features), decoder_input_ids=torch.tensor([tokens]), output_attentions=True)
    theirs = np.stack([out.cross_attentions[layer][0, head].numpy() for layer, head in heads])
    return float(np.abs(ours - theirs).max())
