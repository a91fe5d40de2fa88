"""Whisper's decoder for ortinf's CPU kernel library: `model.cpu.onnx` beside the portable model.onnx,
sharing its weights file and its inputs (ortinf/exporter/kv_write.py place_decoder), as the text decoders'.

Both attentions are `ortinf.PagedAttention` nodes that read the pool in place:
- self-attention as in the text decoders (ortinf/exporter/attention_cpu.py);
- cross-attention with the op's `cross` attribute: each query over exactly its sequence's cached
  encoder K/V, through `cross_block_tables` and `cross_lens` in place of the block tables and context
  lengths. The portable graph gathers every sequence's 1500 cross positions per layer per step
  (18 MB a step per 30-second window at whisper-tiny's size) and masks a padded score matrix; the op
  reads the blocks where they are.

Traced torch code: the exporter imports it, the runtime never does.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AttentionInterface

from ortinf.exporter import attention_cpu as cpu_paged
from ortinf.exporter.cross_decoder import PagedCrossDecoder, trace_decoder
from ortinf.exporter.legacy_attention import CURRENT_BATCH
from ortinf.exporter.tracing import quiet_tracing

ATTENTION_NAME = "ortinf_whisper_cpu_paged"


def _self_attention(module, query, key, value, attention_mask, **kwargs):
    batch = CURRENT_BATCH.get(None)
    if batch is None:  # the encoder keeps transformers' eager attention
        from transformers.models.whisper.modeling_whisper import eager_attention_forward

        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return cpu_paged.paged_attention(module, query, key, value, attention_mask, scaling=kwargs.get("scaling"), ortinf_paged=batch)


class CrossAttentionOp(torch.autograd.Function):
    """One ortinf::PagedAttention node with cross=1: key and value are not read (the query is passed)."""

    @staticmethod
    def forward(ctx, query, key_cache, value_cache, tables, lens, query_lens, num_heads, scale):
        return torch.zeros_like(query)

    @staticmethod
    def symbolic(g, query, key_cache, value_cache, tables, lens, query_lens, num_heads, scale):
        out = g.op(f"{cpu_paged.DOMAIN}::{cpu_paged.OP}", query, query, query, key_cache, value_cache, tables, lens, query_lens,
                   num_heads_i=num_heads, kv_num_heads_i=num_heads, scale_f=scale, cross_i=1)
        out.setType(query.type())
        return out


class CpuWhisperDecoder(PagedCrossDecoder):
    """PagedCrossDecoder's inputs and outputs, with the CPU kernel's attention."""

    def make_batch(self, block_tables, context_lens, query_lens, key_caches, value_caches):
        return cpu_paged.CpuBatch(block_tables=block_tables, context_lens=context_lens, query_lens=query_lens, key_caches=key_caches,
                                  value_caches=value_caches, num_heads=self.heads, num_kv_heads=self.heads, head_dim=self.head_dim,
                                  default_scaling=lambda module, dim: dim**-0.5)

    def cross(self, attention, hidden_states, batch, tables, lens, query_lens):
        query = attention.q_proj(hidden_states).reshape(-1, self.heads * self.head_dim)  # the op scales
        layer = attention.layer_idx
        return CrossAttentionOp.apply(query, batch.key_caches[layer], batch.value_caches[layer], tables, lens, query_lens,
                                      self.heads, float(attention.scaling))


def export_cpu_decoder(model: torch.nn.Module, path: Path) -> None:
    """Traces CpuWhisperDecoder as trace_decoder traces the portable one."""
    config = model.config
    AttentionInterface.register(ATTENTION_NAME, _self_attention)
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        with torch.no_grad(), quiet_tracing():
            trace_decoder(CpuWhisperDecoder(model), config, path, custom_opsets={cpu_paged.DOMAIN: 1})
    finally:
        config._attn_implementation = previous
