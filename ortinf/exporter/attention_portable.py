"""The portable paged-attention kernel: standard ONNX ops only, so one graph runs on every provider.

This is torch code that is traced into the exported graph (the exporter imports it; the runtime
never does). It is registered as a transformers attention function, so it receives q/k/v after RoPE
(and after qk-norm, partial rotary, ...) from every supported architecture.

The design (the token layout, the padded rows, which key slots are valid, the pool's layout, GQA):
docs/exporter.md, "The portable kernel's layout"."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

ATTENTION_NAME = "ortinf_paged"


@dataclass(slots=True)
class PagedBatch:
    """Per-step tensors shared by all layers, plus the per-layer pools and the collected new K/V.

    Head counts and sizes are plain ints (constants in the graph); the step's sizes (num_seqs, the
    padded query length, the number of past slots) are read from the inputs once here, so every
    layer's reshapes use the same values instead of computing their own from tensor shapes.
    """

    block_tables: torch.Tensor  # [S, max_blocks] int64, the blocks holding each sequence's cached tokens
    context_lens: torch.Tensor  # [S] int64, tokens already in the pool
    query_lens: torch.Tensor  # [S] int64, tokens scheduled in this call
    key_caches: list[torch.Tensor]  # per layer [kv_heads, num_blocks, block_size, head_dim]
    value_caches: list[torch.Tensor]
    num_kv_heads: int
    group: int  # query heads per KV head
    head_dim: int
    default_scaling: Callable[[torch.nn.Module, int], float]
    # [T] or None: the last position each token may see when it is past its own (Gemma 3's image tokens at prefill
    # see their whole image: ortinf/exporter/decoder.py IMAGE_SPANS_ATTRIBUTE); among this step's tokens only
    attend_until: torch.Tensor | None = None
    num_seqs: torch.Tensor = field(init=False)  # traced sizes
    rows: torch.Tensor = field(init=False)  # group * Q: query rows per (KV head, sequence)
    num_past: torch.Tensor = field(init=False)  # P = max_blocks * block_size
    pad_index: torch.Tensor = field(init=False)  # [S, Q] flat token index of each padded row
    unpad_index: torch.Tensor = field(init=False)  # [T] padded row (s * Q + i) of each flat token
    query_pos: torch.Tensor = field(init=False)  # [S, Q, 1] absolute position of each padded row
    key_pos: torch.Tensor = field(init=False)  # [S, 1, P + Q] absolute position of each key slot
    valid: torch.Tensor = field(init=False)  # [S, Q, P + Q] bool, causal and length mask
    new_keys: list[torch.Tensor] = field(default_factory=list)
    new_values: list[torch.Tensor] = field(default_factory=list)
    _masks: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ends = torch.cumsum(self.query_lens, 0)  # [S]
        starts = ends - self.query_lens
        num_tokens = ends[-1]  # not ReduceSum: OpenVINO's provider has no int64 ReduceSum
        max_query_len = self.query_lens.max()
        offsets = torch.arange(max_query_len, dtype=torch.int64)  # [Q]
        pad = starts[:, None] + offsets[None, :]  # [S, Q]
        self.pad_index = torch.minimum(pad, num_tokens - 1)
        self.num_seqs = self.query_lens.shape[0]
        self.rows = self.group * self.pad_index.shape[1]

        # The padded row of each flat token: its sequence index times Q plus its offset.
        tokens = torch.arange(num_tokens, dtype=torch.int64)  # [T]
        seq_of = (tokens[:, None] >= starts[None, :]).to(torch.int64).sum(1) - 1  # [T]
        self.unpad_index = seq_of * max_query_len + (tokens - starts[seq_of])

        self.num_past = self.block_tables.shape[1] * self.key_caches[0].shape[2]
        past = torch.arange(self.num_past, dtype=torch.int64)  # [P]
        ctx = self.context_lens[:, None]  # [S, 1]
        qlen = self.query_lens[:, None]
        past_valid = past[None, None, :] < ctx[:, :, None]  # [S, 1, P]
        last = offsets[None, :].expand(self.pad_index.shape[0], offsets.shape[0])  # [S, Q]: causal
        if self.attend_until is not None:
            last = torch.maximum(last, self.attend_until[self.pad_index] - ctx)
        new_valid = (offsets[None, None, :] <= last[:, :, None]) & (offsets[None, None, :] < qlen[:, :, None])
        past_valid = past_valid.expand(self.num_seqs, offsets.shape[0], past.shape[0])
        self.valid = torch.cat([past_valid, new_valid], dim=2)  # [S, Q, P + Q]
        self.query_pos = (ctx + offsets[None, :])[:, :, None]  # [S, Q, 1]
        new_pos = ctx + offsets[None, :]  # [S, Q]
        self.key_pos = torch.cat([past[None, :].expand(self.num_seqs, past.shape[0]), new_pos], dim=1)[:, None, :]

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        """The [S, group * Q, P + Q] mask (rows as the kernel folds them), narrowed to the last
        `sliding_window` positions when given; built once per step and window size."""
        key = sliding_window or 0
        if key not in self._masks:
            valid = self.valid
            if sliding_window:
                # transformers' convention: a query at q sees keys k with q - k < sliding_window.
                valid = valid & ((self.query_pos - self.key_pos) < sliding_window)
            num_keys = valid.shape[2]
            folded = valid[:, None].expand(self.num_seqs, self.group, self.pad_index.shape[1], num_keys)
            self._masks[key] = folded.reshape(self.num_seqs, self.rows, num_keys)
        return self._masks[key]


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    ortinf_paged: PagedBatch | None = None,
    s_aux: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function over the paged pool. `s_aux`: gpt-oss's attention
    sinks [H], one more logit per head that takes probability and gives no value. `bias`: added to the
    scores before the mask, [KVH, S, G * Q, P + Q] in the kernel's row layout (T5's relative position
    bias: ortinf/exporter/t5.py).

    query [1, H, T, D], key/value [1, KVH, T, D] (flattened tokens of all sequences, post-RoPE).
    Returns the attention output as [1, T, H, D], as transformers expects.
    """
    batch = ortinf_paged
    assert batch is not None, "paged_attention runs only inside the ortinf export wrapper"
    layer = module.layer_idx
    kv_heads, group, head_dim = batch.num_kv_heads, batch.group, batch.head_dim
    num_seqs = batch.num_seqs
    if scaling is None:
        scaling = batch.default_scaling(module, head_dim)

    # Token-major views: the transposes cancel against transformers' own (the projections are
    # [T, heads * D]), so q/k/v reach here without a copy and k/v are the graph outputs as they are.
    q = query[0].transpose(0, 1)  # [T, H, D]
    k_new = key[0].transpose(0, 1)  # [T, KVH, D]
    v_new = value[0].transpose(0, 1)
    key_cache, value_cache = batch.key_caches[layer], batch.value_caches[layer]
    # A pool in a smaller dtype than the compute (fp16 KV under fp32 weights): new K/V are rounded
    # into it on the way out, and the gathered blocks widened after the gather (which then moves
    # half the bytes); this step's own keys are scored at full precision.
    batch.new_keys.append(k_new.to(key_cache.dtype))
    batch.new_values.append(v_new.to(value_cache.dtype))

    # One gather along the block axis gives [KVH, S, P, D]: ready for MatMul; it is the only copy
    # of the cached K/V in the graph.
    past_k = key_cache[:, batch.block_tables].reshape(kv_heads, num_seqs, -1, head_dim).to(q.dtype)
    past_v = value_cache[:, batch.block_tables].reshape(kv_heads, num_seqs, -1, head_dim).to(q.dtype)
    new_k = k_new[batch.pad_index].permute(2, 0, 1, 3)  # [KVH, S, Q, D] (small: this step's tokens)
    new_v = v_new[batch.pad_index].permute(2, 0, 1, 3)

    # Fold each KV group into the query rows: [S, Q, KVH, G, D] -> [KVH, S, G * Q, D].
    q = q[batch.pad_index].reshape(num_seqs, -1, kv_heads, group, head_dim)
    q = q.permute(2, 0, 3, 1, 4).reshape(kv_heads, num_seqs, batch.rows, head_dim) * scaling

    # Past and new keys are scored separately and only the scores are concatenated: K/V themselves
    # are never concatenated (that copy cost as much as the gather).
    scores = torch.cat([torch.matmul(q, past_k.transpose(2, 3)), torch.matmul(q, new_k.transpose(2, 3))], dim=3)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    # Where on float inputs (ORT's CPU provider has no Where on bool); a finite fill keeps fully
    # masked padding rows free of NaN.
    scores = torch.where(batch.mask(sliding_window), scores, torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype))
    if s_aux is not None:  # rows are (group member g, query) per KV head: head kv * group + g has sink s_aux[kv * group + g]
        sinks = s_aux.to(scores.dtype).reshape(kv_heads, 1, group, 1, 1).expand(kv_heads, num_seqs, group, scores.shape[2] // group, 1)
        probs = torch.softmax(torch.cat([scores, sinks.reshape(kv_heads, num_seqs, scores.shape[2], 1)], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs[..., : batch.num_past], past_v) + torch.matmul(probs[..., batch.num_past :], new_v)  # [KVH, S, G * Q, D]

    out = out.reshape(kv_heads, num_seqs, group, -1, head_dim).permute(1, 3, 0, 2, 4)  # [S, Q, KVH, G, D]
    out = out.reshape(-1, kv_heads * group, head_dim)[batch.unpad_index]  # [T, H, D]
    return out[None], None
