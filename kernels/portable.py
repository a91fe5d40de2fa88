"""The portable paged-attention kernel: standard ONNX ops only, so one graph runs on every provider.

This is torch code that is traced into the exported graph (the exporter imports it; the runtime
never does). It is registered as a transformers attention function, so it receives q/k/v after RoPE
(and after qk-norm, partial rotary, ...) from every supported architecture.

Token layout. All scheduled tokens of all sequences arrive flattened, sequence after sequence:

    flat tokens   t:  0 1 2 3 4 | 5 | 6 7          query_lens   = [5, 1, 2]
    starts        s:  0         | 5 | 6            context_lens = [0, 9, 3]  (already in the pool)

Attention is computed per sequence on a padded layout [num_seqs, max_query_len]:

    pad_index[s, i] = starts[s] + i   (clamped; rows i >= query_lens[s] are padding, never read back)
    keys of s       = [ pool blocks of s (P = max_blocks * block_size slots) | its new tokens (max_query_len) ]

    key slot j < P  : valid when j < context_lens[s]               (absolute position j)
    key slot P + j' : valid when j' <= i and j' < query_lens[s]    (absolute position context_lens[s] + j')

The pool is [kv_heads, num_blocks, block_size, head_dim] per layer, so gathering a step's blocks
along axis 1 yields [kv_heads, S, P, head_dim], the layout MatMul wants: the gather is the only copy
of the cached K/V in the graph. Grouped-query attention folds each KV group into the query rows
([kv_heads, S, group * Q, D]), so K/V are never repeated per query head, in the pool or the graph. The masks and indices
depend only on the batch layout, so they are built once per step and shared by all layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

KERNEL_NAME = "portable"
ATTENTION_NAME = "ortinf_paged"


@dataclass(slots=True)
class PagedBatch:
    """Per-step tensors shared by all layers, plus the per-layer pools and the collected new K/V."""

    block_tables: torch.Tensor  # [S, max_blocks] int64
    context_lens: torch.Tensor  # [S] int64, tokens already in the pool
    query_lens: torch.Tensor  # [S] int64, tokens scheduled in this call
    key_caches: list[torch.Tensor]  # per layer [kv_heads, num_blocks, block_size, head_dim]
    value_caches: list[torch.Tensor]
    default_scaling: Callable[[torch.nn.Module, int], float]
    pad_index: torch.Tensor = field(init=False)  # [S, Q] flat token index of each padded row
    unpad_index: torch.Tensor = field(init=False)  # [T] padded row (s * Q + i) of each flat token
    query_pos: torch.Tensor = field(init=False)  # [S, Q, 1] absolute position of each padded row
    key_pos: torch.Tensor = field(init=False)  # [S, 1, P + Q] absolute position of each key slot
    valid: torch.Tensor = field(init=False)  # [S, Q, P + Q] bool, causal and length mask
    new_keys: list[torch.Tensor] = field(default_factory=list)
    new_values: list[torch.Tensor] = field(default_factory=list)
    _window_masks: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ends = torch.cumsum(self.query_lens, 0)  # [S]
        starts = ends - self.query_lens
        num_tokens = ends[-1]  # not ReduceSum: OpenVINO's provider has no int64 ReduceSum
        max_query_len = self.query_lens.max()
        offsets = torch.arange(max_query_len, dtype=torch.int64)  # [Q]
        pad = starts[:, None] + offsets[None, :]  # [S, Q]
        self.pad_index = torch.minimum(pad, num_tokens - 1)

        # The padded row of each flat token: its sequence index times Q plus its offset.
        tokens = torch.arange(num_tokens, dtype=torch.int64)  # [T]
        seq_of = (tokens[:, None] >= starts[None, :]).to(torch.int64).sum(1) - 1  # [T]
        self.unpad_index = seq_of * max_query_len + (tokens - starts[seq_of])

        num_blocks_per_seq = self.block_tables.shape[1]
        block_size = self.key_caches[0].shape[2]
        past = torch.arange(num_blocks_per_seq * block_size, dtype=torch.int64)  # [P]
        ctx = self.context_lens[:, None]  # [S, 1]
        qlen = self.query_lens[:, None]
        past_valid = past[None, None, :] < ctx[:, :, None]  # [S, 1, P]
        new_valid = (offsets[None, None, :] <= offsets[None, :, None]) & (offsets[None, None, :] < qlen[:, :, None])
        num_seqs = self.query_lens.shape[0]
        past_valid = past_valid.expand(num_seqs, offsets.shape[0], past.shape[0])
        self.valid = torch.cat([past_valid, new_valid], dim=2)  # [S, Q, P + Q]
        self.query_pos = (ctx + offsets[None, :])[:, :, None]  # [S, Q, 1]
        new_pos = ctx + offsets[None, :]  # [S, Q]
        self.key_pos = torch.cat([past[None, :].expand(num_seqs, past.shape[0]), new_pos], dim=1)[:, None, :]

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        """The [S, Q, P + Q] mask, narrowed to the last `sliding_window` positions when given."""
        if not sliding_window:
            return self.valid
        if sliding_window not in self._window_masks:
            # transformers' convention: a query at q sees keys k with q - k < sliding_window.
            in_window = (self.query_pos - self.key_pos) < sliding_window
            self._window_masks[sliding_window] = self.valid & in_window
        return self._window_masks[sliding_window]


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
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function over the paged pool.

    query [1, H, T, D], key/value [1, KVH, T, D] (flattened tokens of all sequences, post-RoPE).
    Returns the attention output as [1, T, H, D], as transformers expects.
    """
    batch = ortinf_paged
    assert batch is not None, "paged_attention runs only inside the ortinf export wrapper"
    layer = module.layer_idx
    if scaling is None:
        scaling = batch.default_scaling(module, query.shape[-1])

    q = query[0].transpose(0, 1)  # [T, H, D]
    k_new = key[0].transpose(0, 1)  # [T, KVH, D]
    v_new = value[0].transpose(0, 1)
    batch.new_keys.append(k_new)
    batch.new_values.append(v_new)

    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_new.shape[1]
    group = num_heads // num_kv_heads
    num_seqs, max_query_len = batch.pad_index.shape[0], batch.pad_index.shape[1]

    # One gather along the block axis gives [KVH, S, P, D]: ready for MatMul, no transpose, no copy
    # beyond the gather itself.
    key_cache, value_cache = batch.key_caches[layer], batch.value_caches[layer]
    past_k = key_cache[:, batch.block_tables].flatten(2, 3)  # [KVH, S, P, D]
    past_v = value_cache[:, batch.block_tables].flatten(2, 3)
    new_k = k_new[batch.pad_index].permute(2, 0, 1, 3)  # [KVH, S, Q, D] (small: this step's tokens)
    new_v = v_new[batch.pad_index].permute(2, 0, 1, 3)

    # Fold each KV group into the query rows: [S, Q, H, D] -> [KVH, S, G * Q, D].
    q_pad = q[batch.pad_index].reshape(num_seqs, max_query_len, num_kv_heads, group, head_dim)
    q_pad = q_pad.permute(2, 0, 3, 1, 4).reshape(num_kv_heads, num_seqs, group * max_query_len, head_dim) * scaling

    # Past and new keys are scored separately and only the scores are concatenated: K/V themselves
    # are never concatenated (that copy cost as much as the gather).
    scores = torch.cat([torch.matmul(q_pad, past_k.transpose(2, 3)), torch.matmul(q_pad, new_k.transpose(2, 3))], dim=3)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.reshape(num_kv_heads, num_seqs, group, max_query_len, -1)
    mask = batch.mask(sliding_window)[None, :, None, :, :]
    # Where on float inputs (ORT's CPU provider has no Where on bool); a finite fill keeps fully
    # masked padding rows free of NaN.
    scores = torch.where(mask, scores, torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype))
    probs = torch.softmax(scores, dim=-1).reshape(num_kv_heads, num_seqs, group * max_query_len, -1)
    num_past = past_k.shape[2]
    out = torch.matmul(probs[..., :num_past], past_v) + torch.matmul(probs[..., num_past:], new_v)  # [KVH, S, G * Q, D]

    out = out.reshape(num_kv_heads, num_seqs, group, max_query_len, head_dim).permute(1, 3, 0, 2, 4)
    out = out.reshape(num_seqs * max_query_len, num_heads, head_dim)[batch.unpad_index]  # [T, H, D]
    return out[None], None
