"""Mixture-of-experts blocks in the exported graph: top-k routing, and each expert's MLP run only on the
tokens routed to it (never all experts on all tokens).

While exporting, `traceable_moe` gives each sparse MoE block this module's forward instead of transformers'
(whose Python loop over the experts a batch hits would bake in the trace's example): per expert, an unrolled
NonZero picks its (token, slot) rows, its MLP runs on those rows, and a ScatterND with reduction "add" puts the
weighted result back. `traceable_moe(model, fused=True)` gives the CPU kernel graph one `ortinf.MoE` node per block.

The design (the traced form, routing and ties, ORT's MoE op, ortinf.MoE): docs/exporter.md, "Mixture of experts"."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import numpy as np
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


class MoEOp(torch.autograd.Function):
    """Traces to one ortinf::MoE node (ortinf/kernels/cpu/moe.cc); its forward only gives the tracer a shape.
    fp32 experts: the scales inputs are empty tensors (the quantizer replaces weights and scales)."""

    @staticmethod
    def forward(ctx, hidden, logits, gate_up, down, gate_up_bias, down_bias, top_k, normalize, activation, alpha, limit,
                hidden_size, intermediate_size):
        return torch.zeros_like(hidden)

    @staticmethod
    def symbolic(g, hidden, logits, gate_up, down, gate_up_bias, down_bias, top_k, normalize, activation, alpha, limit,
                 hidden_size, intermediate_size):
        empty = g.op("Constant", value_t=torch.zeros(0))
        biases = () if gate_up_bias is None else (gate_up_bias, down_bias)
        out = g.op("ortinf::MoE", hidden, logits, gate_up, empty, down, empty, *biases, top_k_i=top_k, normalize_i=int(normalize),
                   activation_i=activation, alpha_f=alpha, limit_f=limit, bits_i=0, block_size_i=0,
                   hidden_size_i=hidden_size, intermediate_size_i=intermediate_size)
        out.setType(hidden.type())
        return out


def panels(w: torch.Tensor) -> torch.Tensor:
    """Stacked expert weights [E, K, N] as ortinf.MoE reads fp32 experts: panels of 16 columns, each K rows
    of 16 contiguous floats, [E, ceil(N / 16), K, 16] (ortinf/kernels/cpu/moe_impl.h: a job then streams memory).
    Computed in numpy, so the tracer records one constant (one initializer), not the packing's ops."""
    array = w.detach().float().numpy()
    experts, k, n = array.shape
    padded = np.pad(array, ((0, 0), (0, 0), (0, -n % 16)))
    return torch.from_numpy(np.ascontiguousarray(padded.reshape(experts, k, -1, 16).transpose(0, 2, 1, 3)))


def unpanel(p: np.ndarray, n: int) -> np.ndarray:
    """panels' inverse on a numpy array: [E, K, N] (the quantizer packs the experts from it)."""
    experts, tiles, k, width = p.shape
    return p.transpose(0, 2, 1, 3).reshape(experts, k, tiles * width)[:, :, :n]


def _expert_weights(expert: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gate, up, down) weights of a SiLU-gated expert MLP, as nn.Linear holds them ([out, in])."""
    if hasattr(expert, "w1"):  # Mixtral's names
        return expert.w1.weight, expert.w3.weight, expert.w2.weight
    return expert.gate_proj.weight, expert.up_proj.weight, expert.down_proj.weight


def _fused_sparse_forward(block: torch.nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """_sparse_block_forward with the routing and routed experts in one ortinf.MoE node."""
    size = int(block.gate.weight.shape[1])
    hidden = hidden_states.reshape(-1, size)  # a constant size: no shape nodes
    router_logits = block.gate(hidden)
    normalize = type(block).__name__ == "MixtralSparseMoeBlock" or bool(getattr(block, "norm_topk_prob", False))
    weights = [_expert_weights(e) for e in block.experts]
    gate_up = panels(torch.stack([torch.cat([gate.T, up.T], 1) for gate, up, _ in weights]).float())
    down = panels(torch.stack([d.T for _, _, d in weights]).float())
    out = MoEOp.apply(hidden.float(), router_logits.float(), gate_up, down, None, None, block.top_k, normalize, 0, 0.0, 0.0,
                      size, int(weights[0][0].shape[0]))
    if getattr(block, "shared_expert", None) is not None:  # Qwen2-MoE
        out = out + torch.sigmoid(block.shared_expert_gate(hidden)) * block.shared_expert(hidden)
    return out.view_as(hidden_states), router_logits


def _fused_gpt_oss_forward(block: torch.nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    size = int(block.router.weight.shape[1])
    hidden = hidden_states.reshape(-1, size)
    router, experts = block.router, block.experts
    logits = F.linear(hidden, router.weight, router.bias)
    out = MoEOp.apply(hidden, logits, panels(experts.gate_up_proj), panels(experts.down_proj), experts.gate_up_proj_bias,
                      experts.down_proj_bias,
                      router.top_k, True, 1, float(experts.alpha), float(experts.limit), size,
                      int(experts.down_proj.shape[1]))
    return out.view_as(hidden_states), logits


def _silu_experts(block: torch.nn.Module) -> bool:
    return all(type(getattr(e, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation") for e in block.experts)


FUSED = {**dict.fromkeys(MOE_BLOCKS, _fused_sparse_forward), "GptOssMLP": _fused_gpt_oss_forward}


@contextlib.contextmanager
def traceable_moe(model: torch.nn.Module, fused: bool = False) -> Iterator[None]:
    """While tracing, every sparse MoE block of `model` runs this module's traceable forward: the
    portable one, or with `fused` (the CPU kernel library's graph) one ortinf.MoE node per block where
    the experts are SiLU-gated MLPs or gpt-oss's."""
    blocks = [m for m in model.modules() if type(m).__name__ in FORWARDS]
    for block in blocks:
        name = type(block).__name__
        use_fused = fused and (name == "GptOssMLP" or _silu_experts(block))
        block.forward = types.MethodType((FUSED if use_fused else FORWARDS)[name], block)
    try:
        yield
    finally:
        for block in blocks:
            del block.forward  # back to the class's own
