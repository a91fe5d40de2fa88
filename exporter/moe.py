"""Mixture-of-experts blocks in the exported graph: top-k routing, and each expert's MLP run only on the
tokens routed to it (never all experts on all tokens).

transformers' sparse MoE blocks loop over the experts that a batch happens to hit (`expert_hit =
...nonzero()`, then a Python loop): traced, that loop would bake in the experts of the trace's
example. While exporting, `traceable_moe` gives each block this module's forward instead, which
traces to, per expert e (an unrolled loop over all experts):

    rows  = NonZero(top_k_ids == e)          [n_e, 2]: (token, slot) pairs routed to e, n_e >= 0
    y     = expert_e(hidden[token]) * weight[token, slot]
    out   = ScatterND(out, token, y, reduction="add")   (a token reaches e at most once)

so the work is each expert's MLP on its own n_e tokens; an expert that no token chose costs a
zero-row MatMul. Routing is the families' own: softmax over all experts, top-k, then (Mixtral, and
where the config's norm_topk_prob says so) the k weights renormalised; Qwen2-MoE adds its gated
shared expert. Ties in top-k go to the lower expert index (ONNX TopK's rule; `lower_index_ties`
makes PyTorch's reference follow it).

ONNX Runtime's `com.microsoft.MoE` op (CPU since 1.23) fuses this per layer; the portable form here
runs on every provider and is what parity is proven on (docs/exporter.md has the measurements and
the op's limits).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F

# the sparse MoE block class of each family whose block this module replaces while tracing
MOE_BLOCKS = ("MixtralSparseMoeBlock", "Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock", "OlmoeSparseMoeBlock")


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, expert ids [T, k]) of the softmax-then-top-k routing."""
    probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def routed_experts(hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts) -> torch.Tensor:
    """sum over each token's k experts of weight * expert(hidden), each expert run on its tokens only."""
    top_k = ids.shape[-1]
    flat_weights = weights.to(hidden.dtype).reshape(-1)
    out = torch.zeros_like(hidden)
    for index, expert in enumerate(experts):
        rows = torch.nonzero(ids == index)  # [n, 2]: token, slot
        token = rows[:, 0]
        weight = flat_weights[token * top_k + rows[:, 1]]
        out = out.index_put((token,), expert(hidden[token]) * weight[:, None], accumulate=True)
    return out


def _sparse_block_forward(block: torch.nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = hidden_states.shape
    hidden = hidden_states.reshape(-1, shape[-1])
    router_logits = block.gate(hidden)
    normalize = type(block).__name__ == "MixtralSparseMoeBlock" or bool(getattr(block, "norm_topk_prob", False))
    weights, ids = route(router_logits, block.top_k, normalize)
    out = routed_experts(hidden, weights, ids, block.experts)
    if getattr(block, "shared_expert", None) is not None:  # Qwen2-MoE
        out = out + torch.sigmoid(block.shared_expert_gate(hidden)) * block.shared_expert(hidden)
    return out.reshape(shape), router_logits


@contextlib.contextmanager
def lower_index_ties() -> Iterator[None]:
    """While PyTorch computes a reference, its top-k breaks ties as ONNX TopK does: the lower index
    first (torch.topk leaves ties unspecified, and on CPU picks neither end consistently). Routing
    ties are rare with trained weights but real with bf16 ones; parity is stated for this rule."""
    original = torch.topk

    def topk(input: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, **kwargs):  # noqa: A002
        if not largest or kwargs:
            return original(input, k, dim, largest, sorted, **kwargs)
        values, indices = torch.sort(input, dim=dim, descending=True, stable=True)
        return torch.return_types.topk((values.narrow(dim, 0, k), indices.narrow(dim, 0, k)))

    torch.topk = topk
    try:
        yield
    finally:
        torch.topk = original


def _gpt_oss_expert(experts: torch.nn.Module, index: int):
    """gpt-oss's expert `index`: interleaved gate/up with biases, clamped, (up + 1) * gate * sigmoid(alpha gate)."""
    def expert(x: torch.Tensor) -> torch.Tensor:
        gate_up = x @ experts.gate_up_proj[index] + experts.gate_up_proj_bias[index]
        gate, up = gate_up[..., ::2].clamp(max=experts.limit), gate_up[..., 1::2].clamp(min=-experts.limit, max=experts.limit)
        return ((up + 1) * (gate * torch.sigmoid(gate * experts.alpha))) @ experts.down_proj[index] + experts.down_proj_bias[index]

    return expert


def _gpt_oss_forward(block: torch.nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss's MLP: top-k of the router's logits, softmax over those k (the same weights as the
    renormalised softmax), then the experts on their tokens."""
    shape = hidden_states.shape
    hidden = hidden_states.reshape(-1, shape[-1])
    router = block.router
    logits = F.linear(hidden, router.weight, router.bias)
    weights, ids = route(logits, router.top_k, normalize=True)
    experts = [_gpt_oss_expert(block.experts, e) for e in range(block.experts.num_experts)]
    return routed_experts(hidden, weights, ids, experts).reshape(shape), logits


FORWARDS = {**dict.fromkeys(MOE_BLOCKS, _sparse_block_forward), "GptOssMLP": _gpt_oss_forward}


@contextlib.contextmanager
def traceable_moe(model: torch.nn.Module) -> Iterator[None]:
    """While tracing, every sparse MoE block of `model` runs this module's traceable forward."""
    blocks = [m for m in model.modules() if type(m).__name__ in FORWARDS]
    for block in blocks:
        block.forward = types.MethodType(FORWARDS[type(block).__name__], block)
    try:
        yield
    finally:
        for block in blocks:
            del block.forward  # back to the class's own
