"""T5, Flan-T5 and mT5 on the text encoder-decoder path (ortinf/exporter/seq2seq.py): the same packages,
runtime and engine as BART and Marian; what differs is the decoder step, written here because
transformers' T5 attention is not an attention-interface function (it computes its own scores):

- self-attention adds T5's relative position bias: the first layer's bucketed table, indexed by
  key position - query position, computed once per step over the paged layout (every layer shares
  it, as in T5) and added to the scores inside the portable paged kernel (`bias`);
- no 1/sqrt(d) scaling (T5 folds it into its initialisation), in self- and cross-attention;
- RMS layer norms, a ReLU or gated-GELU feed-forward, and with tied embeddings the LM head's input
  scaled by d_model ** -0.5.

The encoder is transformers' own T5 stack, traced whole (its bidirectional bias included), with each
decoder layer's cross K/V projections after it, as for BART.
"""

from __future__ import annotations

import types

import torch

from ortinf.exporter import attention_portable as portable
from ortinf.exporter.cross_decoder import cross_attention

T5_TYPES = ("t5", "mt5")


class T5EncoderGraph(torch.nn.Module):
    """input_ids, attention_mask -> every decoder layer's cross-attention K and V [B, S, heads, d_kv]."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = model.get_encoder()
        self.cross = torch.nn.ModuleList(block.layer[1].EncDecAttention for block in model.get_decoder().block)
        self.heads, self.head_dim = model.config.num_heads, model.config.d_kv

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        shape = (hidden.shape[0], -1, self.heads, self.head_dim)
        outputs = []
        for attention in self.cross:
            outputs += [attention.k(hidden).reshape(shape), attention.v(hidden).reshape(shape)]
        return tuple(outputs)


class PagedT5Decoder(torch.nn.Module):
    """The paged decoder step of a T5 decoder, with PagedCrossDecoder's contract (its inputs and outputs)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        config = model.config
        self.model = model
        self.decoder = model.get_decoder()
        self.heads, self.head_dim = config.num_heads, config.d_kv
        self.scale_output = config.tie_word_embeddings  # T5 v1.0 ties the head to the embeddings and scales its input
        self.bias_table = self.decoder.block[0].layer[0].SelfAttention

    def position_bias(self, batch: portable.PagedBatch, positions: torch.Tensor) -> torch.Tensor:
        """[heads, S, Q, P + Q]: the bias of each (padded query row, key slot), as T5's compute_bias for the
        decoder (unidirectional buckets of key position - query position); masked slots get values that
        the mask discards."""
        query_pos = positions[batch.pad_index][:, :, None]  # [S, Q, 1]
        relative = batch.key_pos - query_pos  # [S, Q, P + Q]
        table = self.bias_table
        buckets = table._relative_position_bucket(relative, bidirectional=False, num_buckets=table.relative_attention_num_buckets,
                                                  max_distance=table.relative_attention_max_distance)
        return table.relative_attention_bias(buckets).permute(3, 0, 1, 2)

    def forward(self, input_ids, positions, block_tables, context_lens, query_lens, logits_indices,
                cross_block_tables, cross_lens, *caches):
        batch = portable.PagedBatch(block_tables=block_tables, context_lens=context_lens, query_lens=query_lens,
                                    key_caches=list(caches[0::2]), value_caches=list(caches[1::2]), num_kv_heads=self.heads, group=1,
                                    head_dim=self.head_dim, default_scaling=lambda module, dim: 1.0)
        bias = self.position_bias(batch, positions)
        hidden = self.decoder.embed_tokens(input_ids)  # [T, d_model]
        tokens = (-1, self.heads, self.head_dim)
        for index, block in enumerate(self.decoder.block):
            layer = types.SimpleNamespace(layer_idx=index)  # what the paged kernel reads of its module
            own, cross, feed_forward = block.layer[0], block.layer[1], block.layer[2]
            attention = own.SelfAttention
            normed = own.layer_norm(hidden)
            q, k, v = (projection(normed).reshape(tokens).transpose(0, 1)[None] for projection in (attention.q, attention.k, attention.v))
            out, _ = portable.paged_attention(layer, q, k, v, None, scaling=1.0, ortinf_paged=batch, bias=bias)
            hidden = hidden + attention.o(out[0].reshape(-1, self.heads * self.head_dim))
            attention = cross.EncDecAttention
            query = attention.q(cross.layer_norm(hidden)).reshape(tokens)  # unscaled, as T5's
            out = cross_attention(query, batch.key_caches[index], batch.value_caches[index], batch, cross_block_tables, cross_lens)
            hidden = hidden + attention.o(out.reshape(-1, self.heads * self.head_dim))
            hidden = hidden + feed_forward.DenseReluDense(feed_forward.layer_norm(hidden))
        hidden = self.decoder.final_layer_norm(hidden[logits_indices])
        if self.scale_output:
            hidden = hidden * (self.model.model_dim**-0.5)
        logits = self.model.lm_head(hidden)
        return (logits, *[t for pair in zip(batch.new_keys, batch.new_values) for t in pair])


__all__ = ["T5_TYPES", "PagedT5Decoder", "T5EncoderGraph"]
