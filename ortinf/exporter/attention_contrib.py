"""The contrib paged kernel: ONNX Runtime's `com.microsoft.PagedAttention` in every layer.

For packages that target the providers that implement it (ORT 1.32: CUDA fp16/bf16, WebGPU fp16):
one fused op per layer reads the pool through the block table and writes the step's K/V into it in
place (its `key_cache_out` output aliases `key_cache`), so the graph needs no gather, mask or
ScatterND of its own. Traced torch code like ortinf/exporter/attention_portable.py: the exporter imports it, the
runtime never does.

Differences from the portable kernel that the runtime honours (the manifest records the kernel):

- pool layout `[num_blocks, block_size, kv_heads, head_dim]` (the op's), and a block size that is a
  power of two, at least 16 (WebGPU refuses others);
- the block table covers the step's new tokens too (the op writes them through it), so padding
  sequences point at the scratch block;
- RoPE stays in the model (`do_rotary=0`): q and k arrive rotated, as transformers computes them;
- no sliding window and no attention-logit soft-capping: the exporter refuses those models for this
  kernel (`local_window_size` and `softcap` exist on the op, but their parity is not proven here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

ATTENTION_NAME = "ortinf_contrib_paged"
DTYPES = ("fp16",)  # the op's T: float16 or bfloat16 (the exporter writes no bf16 yet)


@dataclass(slots=True)
class ContribBatch:
    """Per-step inputs converted once for every layer, plus the pools and the collected outputs."""

    block_tables: torch.Tensor  # [S, max_blocks] int64, covering cached and new tokens
    context_lens: torch.Tensor  # [S] int64
    query_lens: torch.Tensor  # [S] int64
    key_caches: list[torch.Tensor]  # per layer [num_blocks, block_size, kv_heads, head_dim]
    value_caches: list[torch.Tensor]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    cumulative: torch.Tensor = field(init=False)
    past: torch.Tensor = field(init=False)
    table: torch.Tensor = field(init=False)
    new_keys: list[torch.Tensor] = field(default_factory=list)  # the op's key_cache_out per layer
    new_values: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        zero = torch.zeros(1, dtype=torch.int64)
        self.cumulative = torch.cat([zero, torch.cumsum(self.query_lens, 0)]).to(torch.int32)
        self.past = self.context_lens.to(torch.int32)
        self.table = self.block_tables.to(torch.int32)


class PagedAttentionOp(torch.autograd.Function):
    """Traces to one com.microsoft.PagedAttention node; its forward only gives the tracer shapes."""

    @staticmethod
    def forward(ctx, query, key, value, key_cache, value_cache, cumulative, past, table, num_heads, kv_num_heads, scale):
        return torch.zeros_like(query), key_cache.clone(), value_cache.clone()

    @staticmethod
    def symbolic(g, query, key, value, key_cache, value_cache, cumulative, past, table, num_heads, kv_num_heads, scale):
        out, key_out, value_out = g.op("com.microsoft::PagedAttention", query, key, value, key_cache, value_cache, cumulative,
                                       past, table, num_heads_i=num_heads, kv_num_heads_i=kv_num_heads, scale_f=scale, outputs=3)
        for output, like in ((out, query), (key_out, key_cache), (value_out, value_cache)):
            output.setType(like.type())  # the tracer cannot infer a contrib op's shapes
        return out, key_out, value_out


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    ortinf_paged: ContribBatch | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function: q [1, H, T, D], k/v [1, KVH, T, D] (post-RoPE)
    in, [1, T, H, D] out."""
    batch = ortinf_paged
    assert batch is not None, "paged_attention runs only inside the ortinf export wrapper"
    assert not sliding_window and not softcap, "the exporter refuses these models for this kernel"
    layer = module.layer_idx
    num_tokens = query.shape[2]
    q = query[0].transpose(0, 1).reshape(num_tokens, batch.num_heads * batch.head_dim)
    k = key[0].transpose(0, 1).reshape(num_tokens, batch.num_kv_heads * batch.head_dim)
    v = value[0].transpose(0, 1).reshape(num_tokens, batch.num_kv_heads * batch.head_dim)
    scale = float(scaling) if scaling is not None else batch.head_dim**-0.5
    out, key_out, value_out = PagedAttentionOp.apply(
        q, k, v, batch.key_caches[layer], batch.value_caches[layer], batch.cumulative, batch.past, batch.table,
        batch.num_heads, batch.num_kv_heads, scale)
    batch.new_keys.append(key_out)
    batch.new_values.append(value_out)
    return out.reshape(1, num_tokens, batch.num_heads, batch.head_dim), None
