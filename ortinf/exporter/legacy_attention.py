"""Decoders whose attention modules in transformers 4.57 predate the attention interface (Qwen2-MoE,
OLMoE: eager/SDPA/flash classes that compute attention themselves, and base models whose forward
takes no extra keyword arguments). While tracing, their attention modules run `_forward` below,
which computes q/k/v exactly as the module does (OLMoE's qk-norm over the whole projection and
clip_qkv included) and hands them to the paged attention function like every other architecture;
the step's batch reaches it through `CURRENT_BATCH`, since the model's forward cannot carry it.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import types
from collections.abc import Iterator

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ortinf.errors import UnsupportedArchitectureError

LEGACY = ("Qwen2MoeAttention", "Qwen2MoeSdpaAttention", "Qwen2MoeFlashAttention2", "OlmoeAttention", "OlmoeSdpaAttention",
          "OlmoeFlashAttention2")
CURRENT_BATCH: contextvars.ContextVar = contextvars.ContextVar("ortinf_paged_batch")


def _forward(self: torch.nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
             position_ids: torch.Tensor | None = None, past_key_values: object = None, output_attentions: bool = False,
             use_cache: bool = False, cache_position: torch.Tensor | None = None,
             position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, **kwargs: object):
    batch, length, _ = hidden_states.shape
    query, key, value = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
    if hasattr(self, "q_norm"):  # OLMoE normalises the whole projections
        query, key = self.q_norm(query), self.k_norm(key)
    clip = getattr(self.config, "clip_qkv", None)
    if clip is not None:
        query, key, value = (t.clamp(min=-clip, max=clip) for t in (query, key, value))
    query = query.view(batch, length, -1, self.head_dim).transpose(1, 2)
    key = key.view(batch, length, -1, self.head_dim).transpose(1, 2)
    value = value.view(batch, length, -1, self.head_dim).transpose(1, 2)
    cos, sin = position_embeddings
    # through the modeling module, so that the CPU kernel graph's RoPE-in-the-op patch applies
    query, key = sys.modules[type(self).__module__].apply_rotary_pos_emb(query, key, cos, sin)
    attention = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
    output, _ = attention(self, query, key, value, None, scaling=self.head_dim**-0.5, ortinf_paged=CURRENT_BATCH.get())
    return self.o_proj(output.reshape(batch, length, -1)), None


def has_legacy_attention(model: torch.nn.Module) -> bool:
    return any(type(m).__name__ in LEGACY for m in model.modules())


@contextlib.contextmanager
def legacy_attention(model: torch.nn.Module, batch: object) -> Iterator[None]:
    """While tracing, the model's legacy attention modules run `_forward` with `batch`."""
    modules = [m for m in model.modules() if type(m).__name__ in LEGACY]
    if modules and getattr(model.config, "use_sliding_window", False):
        raise UnsupportedArchitectureError(f"{model.config.model_type} with use_sliding_window is not supported: "
                                           "export a configuration without it")
    for module in modules:
        module.forward = types.MethodType(_forward, module)
    token = CURRENT_BATCH.set(batch)
    try:
        yield
    finally:
        CURRENT_BATCH.reset(token)
        for module in modules:
            del module.forward
