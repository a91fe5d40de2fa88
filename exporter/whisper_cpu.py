"""Whisper's decoder for ortinf's CPU kernel library: `model.cpu.onnx` beside the portable model.onnx,
sharing its weights file and its inputs (exporter/kv_write.py place_decoder), as the text decoders'.

Both attentions are `ortinf.PagedAttention` nodes that read the pool in place:
- self-attention as in the text decoders (exporter/attention_cpu.py);
- cross-attention with the op's `cross` attribute: each query over exactly its sequence's cached
  encoder K/V, through `cross_block_tables` and `cross_lens` in place of the block tables and context
  lengths. The portable graph gathers every sequence's 1500 cross positions per layer per step
  (18 MB a step per 30-second window at whisper-tiny's size) and masks a padded score matrix; the op
  reads the blocks where they are.

Traced torch code: the exporter imports it, the runtime never does.
"""

from __future__ import annotations

import types
from pathlib import Path

import torch
from transformers import AttentionInterface

from ortinf.exporter import attention_cpu as cpu_paged
from ortinf.exporter.legacy_attention import CURRENT_BATCH
from ortinf.exporter.tracing import OPSET, quiet_tracing

ATTENTION_NAME = "ortinf_whisper_cpu_paged"


def _self_attention(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN201
    batch = CURRENT_BATCH.get(None)
    if batch is None:  # the encoder keeps transformers' eager attention
        from transformers.models.whisper.modeling_whisper import eager_attention_forward

        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return cpu_paged.paged_attention(module, query, key, value, attention_mask, scaling=kwargs.get("scaling"), ortinf_paged=batch)


class CrossAttentionOp(torch.autograd.Function):
    """One ortinf::PagedAttention node with cross=1: key and value are not read (the query is passed)."""

    @staticmethod
    def forward(ctx, query, key_cache, value_cache, tables, lens, query_lens, num_heads, scale):  # noqa: ANN001
        return torch.zeros_like(query)

    @staticmethod
    def symbolic(g, query, key_cache, value_cache, tables, lens, query_lens, num_heads, scale):  # noqa: ANN001
        out = g.op(f"{cpu_paged.DOMAIN}::{cpu_paged.OP}", query, query, query, key_cache, value_cache, tables, lens, query_lens,
                   num_heads_i=num_heads, kv_num_heads_i=num_heads, scale_f=scale, cross_i=1)
        out.setType(query.type())
        return out


class CpuWhisperDecoder(torch.nn.Module):
    """PagedWhisperDecoder's inputs and outputs, with the CPU kernel's attention."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.decoder = model.model.decoder
        self.heads = model.config.decoder_attention_heads
        self.head_dim = model.config.d_model // self.heads

    def forward(self, input_ids, positions, block_tables, context_lens, query_lens, logits_indices,  # noqa: ANN001, ANN201
                cross_block_tables, cross_lens, *caches):
        batch = cpu_paged.CpuBatch(block_tables=block_tables, context_lens=context_lens, query_lens=query_lens,
                                   key_caches=list(caches[0::2]), value_caches=list(caches[1::2]), num_heads=self.heads,
                                   num_kv_heads=self.heads, head_dim=self.head_dim, default_scaling=lambda module, dim: dim**-0.5)
        width = self.heads * self.head_dim

        def cross_forward(attention, hidden_states, key_value_states=None, **kwargs):  # noqa: ANN001, ANN202
            query = attention.q_proj(hidden_states).reshape(-1, width)  # the op scales
            layer = attention.layer_idx
            out = CrossAttentionOp.apply(query, batch.key_caches[layer], batch.value_caches[layer], cross_block_tables, cross_lens,
                                         query_lens, self.heads, float(attention.scaling))
            return attention.out_proj(out.reshape(1, -1, width)), None

        patched = [layer.encoder_attn for layer in self.decoder.layers]
        for attention in patched:
            attention.forward = types.MethodType(cross_forward, attention)
        token = CURRENT_BATCH.set(batch)
        try:
            dummy = torch.zeros(1, 1, self.model.config.d_model, dtype=self.decoder.embed_tokens.weight.dtype)  # turns cross-attention on
            hidden = self.decoder(input_ids=input_ids[None], position_ids=positions[None], encoder_hidden_states=dummy,
                                  use_cache=False).last_hidden_state[0]
        finally:
            CURRENT_BATCH.reset(token)
            for attention in patched:
                del attention.forward
        logits = self.model.proj_out(hidden[logits_indices])
        return (logits, *[t for pair in zip(batch.new_keys, batch.new_values) for t in pair])


def export_cpu_decoder(model: torch.nn.Module, path: Path, example: tuple, input_names: list[str], output_names: list[str],
                       axes: dict) -> None:
    """Traces CpuWhisperDecoder with the portable trace's example, names and axes."""
    config = model.config
    AttentionInterface.register(ATTENTION_NAME, _self_attention)
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        with torch.no_grad(), quiet_tracing():
            torch.onnx.export(CpuWhisperDecoder(model).eval(), example, str(path), dynamo=False, input_names=input_names,
                              output_names=output_names, dynamic_axes=axes, opset_version=OPSET,
                              custom_opsets={cpu_paged.DOMAIN: 1})
    finally:
        config._attn_implementation = previous
