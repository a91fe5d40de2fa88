"""The CPU paged kernel as traced: one `ortinf.PagedAttention` node per layer (the op is C++ in
ortinf/kernels/cpu/, loaded by ortinf/kernels/library.py).

Packages carry this graph (`model.cpu.onnx`) beside the portable one (`model.onnx`), sharing its
weights file: the CPU provider runs it when ortinf's kernel library loads, every other provider (and
the CPU without the library) runs the portable graph. The pool layout, the graph inputs and the
in-graph KV write (ortinf/exporter/kv_write.py) are the portable kernel's, so one pool and one runtime
serve both; only the attention differs: the op reads the cached K/V in place through the block
table, stops at each sequence's own length and needs no masks, pad indices or gathers, so none of
those nodes are in this graph.

RoPE moves into the op too where the architecture allows it (DecoderArch.rope_in_kernel): while the
CPU graph is traced, `rope_in_kernel` makes the modeling module's apply_rotary_pos_emb return q and k
unrotated and hands the step's cos/sin to the op, which rotates the query rows as it loads them and
the step's keys once, and returns the rotated keys for the pool write. Measured on the benchmark's
llama (docs/performance.md): ~22 of each layer's ~70 nodes go (the two rotate_half chains and the
shape arithmetic that sizes their halves), which is what one-sequence decode steps pay for.

Traced torch code like ortinf/exporter/attention_portable.py: the exporter imports it, the runtime never does.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
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
    # [T, rotary_dim] for the next layer's op when RoPE runs in it (rope_in_kernel); taken by that call
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None


@contextlib.contextmanager
def rope_in_kernel(model: torch.nn.Module, batch: CpuBatch, half_tables: bool = False) -> Iterator[None]:
    """While tracing, the modeling modules' apply_rotary_pos_emb(q, k, cos, sin, ...) returns q and k
    unrotated and hands cos/sin to the layer's own attention call, which gives them to the op. Per
    layer: Gemma 3's local and global layers have different bases, and SmolLM3's NoPE layers call
    no RoPE at all (their op gets no cos/sin)."""
    modules = {sys.modules[type(m).__module__] for m in model.modules()}
    patched = [(m, m.apply_rotary_pos_emb) for m in modules if callable(getattr(m, "apply_rotary_pos_emb", None))]

    def deferred(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *args: object, **kwargs: object):
        assert cos.dim() == 3 and cos.shape[0] == 1, "expected cos/sin of shape [1, num_tokens, rotary_dim]"
        if half_tables:  # gpt-oss's tables hold each frequency once: rotate_half's form repeats them
            cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        batch.cos, batch.sin = cos[0].float(), sin[0].float()
        return q, k

    for module, _ in patched:
        module.apply_rotary_pos_emb = deferred
    try:
        yield
    finally:
        for module, original in patched:
            module.apply_rotary_pos_emb = original


class Int8PagedAttentionOp(torch.autograd.Function):
    """The node over an int8 pool: outputs 2 and 3 are the step's K and V as the pool's rows
    ([T, kv_heads * (head_dim + 4)] int8), which the graph's KV write scatters; cos/sin and sinks as
    in RotaryPagedAttentionOp when given."""

    @staticmethod
    def forward(ctx, query, key, value, key_cache, value_cache, tables, context_lens, query_lens, cos, sin, sinks,
                num_heads, kv_num_heads, scale, sliding_window, softcap):
        rows = torch.zeros(key.shape[0], kv_num_heads * key_cache.shape[3], dtype=torch.int8)
        return torch.zeros_like(query), torch.zeros_like(key), rows, rows.clone()

    @staticmethod
    def symbolic(g, query, key, value, key_cache, value_cache, tables, context_lens, query_lens, cos, sin, sinks,
                 num_heads, kv_num_heads, scale, sliding_window, softcap):
        extra = tuple(x for x in (cos, sin, sinks) if x is not None)
        out, rotated, key_rows, value_rows = g.op(
            f"{DOMAIN}::{OP}", query, key, value, key_cache, value_cache, tables, context_lens, query_lens, *extra,
            num_heads_i=num_heads, kv_num_heads_i=kv_num_heads, scale_f=scale, sliding_window_i=sliding_window,
            softcap_f=softcap, outputs=4)
        out.setType(query.type())
        rotated.setType(key.type())
        key_rows.setType(key.type().with_dtype(torch.int8))
        value_rows.setType(key.type().with_dtype(torch.int8))
        return out, rotated, key_rows, value_rows


class PagedAttentionOp(torch.autograd.Function):
    """Traces to one ortinf::PagedAttention node; its forward only gives the tracer a shape."""

    @staticmethod
    def forward(ctx, query, key, value, key_cache, value_cache, tables, context_lens, query_lens,
                num_heads, kv_num_heads, scale, sliding_window, softcap):
        return torch.zeros_like(query)

    @staticmethod
    def symbolic(g, query, key, value, key_cache, value_cache, tables, context_lens, query_lens,
                 num_heads, kv_num_heads, scale, sliding_window, softcap):
        out = g.op(f"{DOMAIN}::{OP}", query, key, value, key_cache, value_cache, tables, context_lens, query_lens,
                   num_heads_i=num_heads, kv_num_heads_i=kv_num_heads, scale_f=scale, sliding_window_i=sliding_window,
                   softcap_f=softcap)
        out.setType(query.type())  # the tracer cannot infer a custom op's shape
        return out


class RotaryPagedAttentionOp(torch.autograd.Function):
    """The same node with cos/sin inputs (RoPE in the op) and the rotated keys as a second output; and
    with gpt-oss's attention sinks [num_heads] as an eleventh input when the model has them."""

    @staticmethod
    def forward(ctx, query, key, value, key_cache, value_cache, tables, context_lens, query_lens, cos, sin, sinks,
                num_heads, kv_num_heads, scale, sliding_window, softcap):
        return torch.zeros_like(query), torch.zeros_like(key)

    @staticmethod
    def symbolic(g, query, key, value, key_cache, value_cache, tables, context_lens, query_lens, cos, sin, sinks,
                 num_heads, kv_num_heads, scale, sliding_window, softcap):
        extra = () if sinks is None else (sinks,)
        out, rotated = g.op(f"{DOMAIN}::{OP}", query, key, value, key_cache, value_cache, tables, context_lens, query_lens,
                            cos, sin, *extra, num_heads_i=num_heads, kv_num_heads_i=kv_num_heads, scale_f=scale,
                            sliding_window_i=sliding_window, softcap_f=softcap, outputs=2)
        out.setType(query.type())
        rotated.setType(key.type())
        return out, rotated


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
    s_aux: torch.Tensor | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function: q [1, H, T, D], k/v [1, KVH, T, D] (post-RoPE)
    in, [1, T, H, D] out."""
    batch = ortinf_paged
    assert batch is not None, "paged_attention runs only inside the ortinf export wrapper"
    layer = module.layer_idx
    # shapes with -1 for the token count, never query.shape[2]: a traced size becomes a Shape -> Gather
    # -> Unsqueeze -> Concat chain per reshape, and node count is what a one-sequence step pays for
    q = query.transpose(1, 2).reshape(-1, batch.num_heads * batch.head_dim)
    k = key.transpose(1, 2).reshape(-1, batch.num_kv_heads, batch.head_dim)  # [T, KVH, D]: the KV write's input
    v = value.transpose(1, 2).reshape(-1, batch.num_kv_heads, batch.head_dim)
    key_cache, value_cache = batch.key_caches[layer], batch.value_caches[layer]
    if scaling is None:
        scaling = batch.default_scaling(module, batch.head_dim)
    flat = -1, batch.num_kv_heads * batch.head_dim
    common = (batch.block_tables, batch.context_lens, batch.query_lens)
    attributes = (batch.num_heads, batch.num_kv_heads, float(scaling), int(sliding_window or 0), float(softcap or 0.0))
    cos, sin, batch.cos, batch.sin = batch.cos, batch.sin, None, None
    sinks = None if s_aux is None else s_aux.float()  # gpt-oss: one sink logit per query head
    if sinks is not None and cos is None:
        raise NotImplementedError("attention sinks on the CPU kernel need RoPE in the op (DecoderArch.rope_in_kernel)")
    if key_cache.dtype == torch.int8:  # the op quantizes the step's K/V into the pool's rows
        out, _, key_rows, value_rows = Int8PagedAttentionOp.apply(q, k.reshape(flat), v.reshape(flat), key_cache, value_cache,
                                                                   *common, cos, sin, sinks, *attributes)
        batch.new_keys.append(key_rows.reshape(-1, batch.num_kv_heads, key_cache.shape[3]))
        batch.new_values.append(value_rows.reshape(-1, batch.num_kv_heads, key_cache.shape[3]))
        return out.reshape(1, -1, batch.num_heads, batch.head_dim), None
    if cos is not None:  # q and k arrive unrotated (rope_in_kernel): the op rotates them
        out, rotated = RotaryPagedAttentionOp.apply(q, k.reshape(flat), v.reshape(flat), key_cache, value_cache, *common,
                                                    cos, sin, sinks, *attributes)
        k = rotated.reshape(-1, batch.num_kv_heads, batch.head_dim)
    else:
        out = PagedAttentionOp.apply(q, k.reshape(flat), v.reshape(flat), key_cache, value_cache, *common, *attributes)
    batch.new_keys.append(k.to(key_cache.dtype))
    batch.new_values.append(v.to(value_cache.dtype))
    return out.reshape(1, -1, batch.num_heads, batch.head_dim), None


def wants_cpu_graph(kernel: str, dtype: str, cpu_kv_dtype: str = "") -> bool:
    """Whether this export writes model.cpu.onnx: portable decoders that compute in fp32, when ortinf's
    kernel library loads here (it verifies the graph); otherwise one warning says why not (an error
    with --kv-dtype int8, which only that graph reads)."""
    from ortinf.errors import ExportError
    from ortinf.kernels import library
    from ortinf.manifest import PORTABLE

    if kernel != PORTABLE or dtype not in ("fp32", "bf16", "int8", "int4"):  # the graph computes in fp32
        if cpu_kv_dtype:
            raise ExportError(f"--kv-dtype int8 is read by ortinf's CPU kernel graph, which computes in fp32: not at --dtype {dtype}")
        return False
    if library.load() is None:
        if cpu_kv_dtype:
            raise ExportError("--kv-dtype int8 is read by ortinf's kernel library, which is not loaded here: build it with "
                              "`python -m ortinf.kernels.build`, or choose --kv-dtype fp16")
        logging.getLogger(__name__).warning("this package gets no graph for ortinf's CPU kernel library (the library is not loaded here): "
                    "on the CPU it runs the portable kernel. Build the library and re-export for the faster graph")
        return False
    return True
