"""The paged cross-attention decoder that Whisper, BART and Marian share (its graph is `model.onnx` of their
packages): the text decoders' paged contract plus `cross_block_tables [S, cross_blocks]` and
`cross_lens [S]`, through which each sequence's cross-attention reads the encoder's K/V from pool
blocks of its own (ortinf/exporter/whisper.py says why the pool). Self-attention goes through the
portable paged kernel, registered as ATTENTION_NAME; a family's module subclasses PagedCrossDecoder
for what differs (BART's and Marian's embeddings and logits bias: ortinf/exporter/seq2seq.py; the CPU
kernel's attention: ortinf/exporter/whisper_cpu.py). Nothing here imports a family's module: the
families import this one (the exporter's import circle api <-> whisper <-> whisper_cpu <-> seq2seq is
gone since issue 30).
"""

from __future__ import annotations

import types
from pathlib import Path

import torch

from ortinf.exporter import attention_portable as portable
from ortinf.exporter.legacy_attention import CURRENT_BATCH
from ortinf.exporter.tracing import OPSET

ATTENTION_NAME = "ortinf_whisper_paged"
CROSS_INPUTS = ("cross_block_tables", "cross_lens")


def self_attention(module, query, key, value, attention_mask, **kwargs):
    """Whisper's decoder self-attention calls this with no way to pass the batch: it comes from
    CURRENT_BATCH. The encoder (the same config, no batch) keeps transformers' eager attention."""
    batch = CURRENT_BATCH.get(None)
    if batch is None:  # the model's own eager attention (Whisper's, BART's, Marian's)
        import sys

        return sys.modules[type(module).__module__].eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return portable.paged_attention(module, query, key, value, attention_mask, scaling=kwargs.get("scaling"), ortinf_paged=batch)


def cross_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, batch: portable.PagedBatch,
                    cross_tables: torch.Tensor, cross_lens: torch.Tensor) -> torch.Tensor:
    """query [T, H, D] (scaled) against each sequence's cross K/V in its pool blocks: [T, H, D]."""
    heads, head_dim = key_cache.shape[0], key_cache.shape[3]
    num_seqs = batch.num_seqs
    keys = key_cache[:, cross_tables].reshape(heads, num_seqs, -1, head_dim)  # [H, S, C, D]
    values = value_cache[:, cross_tables].reshape(heads, num_seqs, -1, head_dim)
    q = query[batch.pad_index].permute(2, 0, 1, 3)  # [H, S, Q, D]
    scores = torch.matmul(q, keys.transpose(2, 3))  # [H, S, Q, C]
    visible = torch.arange(keys.shape[2], dtype=torch.int64)[None, None, :] < cross_lens[:, None, None]  # [S, 1, C]
    scores = torch.where(visible[None], scores, torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype))
    out = torch.matmul(torch.softmax(scores, dim=-1), values)  # [H, S, Q, D]
    return out.permute(1, 2, 0, 3).reshape(-1, heads, head_dim)[batch.unpad_index]


class PagedCrossDecoder(torch.nn.Module):
    """The paged decoder step: self-attention over the pool, cross-attention over each sequence's cross blocks."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.decoder = model.get_decoder()
        self.num_layers = model.config.decoder_layers
        self.heads = model.config.decoder_attention_heads
        self.head_dim = model.config.d_model // self.heads

    def forward(self, input_ids, positions, block_tables, context_lens, query_lens, logits_indices,
                cross_block_tables, cross_lens, *caches):
        batch = self.make_batch(block_tables, context_lens, query_lens, list(caches[0::2]), list(caches[1::2]))

        def cross_forward(attention, hidden_states, key_value_states=None, **kwargs):
            out = self.cross(attention, hidden_states, batch, cross_block_tables, cross_lens, query_lens)
            return attention.out_proj(out.reshape(1, -1, self.heads * self.head_dim)), None

        patched = [layer.encoder_attn for layer in self.decoder.layers]
        for attention in patched:
            attention.forward = types.MethodType(cross_forward, attention)
        token = CURRENT_BATCH.set(batch)
        try:
            dummy = torch.zeros(1, 1, self.model.config.d_model, dtype=self.decoder.embed_tokens.weight.dtype)  # turns cross-attention on
            hidden = self.run_decoder(input_ids, positions, dummy)
        finally:
            CURRENT_BATCH.reset(token)
            for attention in patched:
                del attention.forward
        logits = self.logits(hidden[logits_indices])
        return (logits, *[t for pair in zip(batch.new_keys, batch.new_values) for t in pair])

    def make_batch(self, block_tables, context_lens, query_lens, key_caches, value_caches):
        """The per-step batch the self-attention function reads (the portable kernel's)."""
        return portable.PagedBatch(block_tables=block_tables, context_lens=context_lens, query_lens=query_lens,
                                   key_caches=key_caches, value_caches=value_caches, num_kv_heads=self.heads, group=1,
                                   head_dim=self.head_dim, default_scaling=lambda module, dim: dim**-0.5)

    def cross(self, attention, hidden_states, batch, tables, lens, query_lens):
        """One layer's cross-attention output [T, H, D] over each sequence's cross blocks."""
        query = (attention.q_proj(hidden_states) * attention.scaling).reshape(-1, self.heads, self.head_dim)
        layer = attention.layer_idx
        return cross_attention(query, batch.key_caches[layer], batch.value_caches[layer], batch, tables, lens)

    def run_decoder(self, input_ids: torch.Tensor, positions: torch.Tensor, dummy: torch.Tensor) -> torch.Tensor:
        """The decoder's hidden states [T, d_model] for the flat tokens at their positions."""
        return self.decoder(input_ids=input_ids[None], position_ids=positions[None], encoder_hidden_states=dummy,
                            use_cache=False).last_hidden_state[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.proj_out(hidden)


def decoder_dims(config) -> tuple[int, int, int]:
    """(decoder layers, heads, head size) of an encoder-decoder's config (T5's names or BART's)."""
    if getattr(config, "d_kv", None) is not None:  # T5, mT5
        return config.num_decoder_layers, config.num_heads, config.d_kv
    return config.decoder_layers, config.decoder_attention_heads, config.d_model // config.decoder_attention_heads


def trace_decoder(module: torch.nn.Module, config, path: Path, custom_opsets: dict | None = None) -> None:
    """Traces a paged cross-attention decoder step (PagedCrossDecoder or a subclass) to `path`:
    the paged contract's inputs plus CROSS_INPUTS, logits and each layer's new K/V out."""
    layers, heads, head_dim = decoder_dims(config)
    block_size, blocks = 4, 8
    caches = [torch.randn(heads, blocks, block_size, head_dim) for _ in range(2 * layers)]
    example = (torch.tensor([1, 2, 3, 4]), torch.tensor([2, 3, 4, 5]), torch.tensor([[3, 1], [0, 5]]), torch.tensor([2, 5]),
               torch.tensor([3, 1]), torch.tensor([2, 3]), torch.tensor([[6, 7], [2, 4]]), torch.tensor([6, 8]), *caches)
    cache_names = [f"{kind}_cache.{i}" for i in range(layers) for kind in ("key", "value")]
    new_names = [f"new_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
    axes = {"input_ids": {0: "num_tokens"}, "positions": {0: "num_tokens"}, "block_tables": {0: "num_seqs", 1: "max_blocks"},
            "context_lens": {0: "num_seqs"}, "query_lens": {0: "num_seqs"}, "logits_indices": {0: "num_seqs"},
            "cross_block_tables": {0: "num_seqs", 1: "cross_blocks"}, "cross_lens": {0: "num_seqs"}, "logits": {0: "num_seqs"},
            **{n: {1: "num_blocks", 2: "block_size"} for n in cache_names}, **{n: {0: "num_tokens"} for n in new_names}}
    torch.onnx.export(module.eval(), example, str(path), dynamo=False,
                      input_names=["input_ids", "positions", "block_tables", "context_lens", "query_lens", "logits_indices",
                                   *CROSS_INPUTS, *cache_names],
                      output_names=["logits", *new_names], dynamic_axes=axes, opset_version=OPSET, custom_opsets=custom_opsets)


__all__ = ["ATTENTION_NAME", "CROSS_INPUTS", "PagedCrossDecoder", "cross_attention", "decoder_dims", "self_attention", "trace_decoder"]
