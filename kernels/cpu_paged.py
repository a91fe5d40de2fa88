"""The CPU paged kernel as traced: one `ortinf.PagedAttention` node per layer (the op is C++ in
kernels/cpu/, loaded by kernels/library.py).

Packages carry this graph (`model.cpu.onnx`) beside the portable one (`model.onnx`), sharing its
weights file: the CPU provider runs it when ortinf's kernel library loads, every other provider (and
the CPU without the library) runs the portable graph. The pool layout, the graph inputs and the
in-graph KV write (exporter/kv_write.py) are the portable kernel's, so one pool and one runtime
serve both; only the attention differs: the op reads the cached K/V in place through the block
table, stops at each sequence's own length and needs no masks, pad indices or gathers, so none of
those nodes are in this graph.

Traced torch code like kernels/portable.py: the exporter imports it, the runtime never does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

ATTENTION_NAME = "ortinf_cpu_paged"
DOMAIN = "ortinf"
OP = "PagedAttention"


@dataclass(slots=True)
class CpuBatch:
    """The step's inputs every layer's op takes, the per-layer pools, and the collected new K/V."""

    block_tables: torch.Tensor
    context_lens: torch.Tensor
    query_lens: torch.Tensor
    key_caches: list[torch.Tensor]
    value_caches: list[torch.Tensor]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    default_scaling: Callable[[torch.nn.Module, int], float]
    new_keys: list[torch.Tensor] = field(default_factory=list)
    new_values: list[torch.Tensor] = field(default_factory=list)


class PagedAttentionOp(torch.autograd.Function):
    """Traces to one ortinf::PagedAttention node; its forward only gives the tracer a shape."""

    @staticmethod
    def forward(ctx, query, key, value, key_cache, value_cache, tables, context_lens, query_lens,  # noqa: ANN001
                num_heads, kv_num_heads, scale, sliding_window, softcap):
        return torch.zeros_like(query)

    @staticmethod
    def symbolic(g, query, key, value, key_cache, value_cache, tables, context_lens, query_lens,  # noqa: ANN001
                 num_heads, kv_num_heads, scale, sliding_window, softcap):
        out = g.op(f"{DOMAIN}::{OP}", query, key, value, key_cache, value_cache, tables, context_lens, query_lens,
                   num_heads_i=num_heads, kv_num_heads_i=kv_num_heads, scale_f=scale, sliding_window_i=sliding_window,
                   softcap_f=softcap)
        out.setType(query.type())  # the tracer cannot infer a custom op's shape
        return out


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    ortinf_paged: CpuBatch | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function: q [1, H, T, D], k/v [1, KVH, T, D] (post-RoPE)
    in, [1, T, H, D] out."""
    batch = ortinf_paged
    assert batch is not None, "paged_attention runs only inside the ortinf export wrapper"
    layer = module.layer_idx
    num_tokens = query.shape[2]
    q = query[0].transpose(0, 1).reshape(num_tokens, batch.num_heads * batch.head_dim)
    k = key[0].transpose(0, 1)  # [T, KVH, D]: the graph's new K/V output (the KV write's input)
    v = value[0].transpose(0, 1)
    key_cache, value_cache = batch.key_caches[layer], batch.value_caches[layer]
    batch.new_keys.append(k.to(key_cache.dtype))
    batch.new_values.append(v.to(value_cache.dtype))
    if scaling is None:
        scaling = batch.default_scaling(module, batch.head_dim)
    flat = num_tokens, batch.num_kv_heads * batch.head_dim
    out = PagedAttentionOp.apply(
        q, k.reshape(flat), v.reshape(flat), key_cache, value_cache, batch.block_tables, batch.context_lens,
        batch.query_lens, batch.num_heads, batch.num_kv_heads, float(scaling), int(sliding_window or 0), float(softcap or 0.0))
    return out.reshape(1, num_tokens, batch.num_heads, batch.head_dim), None
