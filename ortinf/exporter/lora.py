"""LoRA inputs in the decoder graph (`ortinf export --enable-lora`): any number of adapters of any
rank, one per request, in one batch.

Every target linear layer (the nn.Linear children of each layer's self_attn and mlp) computes, in the graph,

    y = base(x) + ((x @ lora_a.{layer}.{target}) * lora_mask) @ lora_b.{layer}.{target}

with the loaded adapters side by side in a dynamic width W (ortinf/runtime/worker/lora.py lays them out).

The design (the inputs' shapes, why one input per layer and target, the cost): docs/lora.md, "How the graph does it"."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from ortinf.manifest import LORA_MASK, lora_a_name, lora_b_name

PARENTS = ("self_attn", "mlp")
EXCLUDED = ("gate",)  # a mixture-of-experts router, not a projection


def layers_of(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers (empty for a model without a `layers` list, e.g. GPT-2's `h` of Conv1D blocks)."""
    base = model.base_model
    base = model.model if base is model else base
    return getattr(base, "layers", torch.nn.ModuleList())


def find_targets(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """{target name: (in_features, out_features)} of the linear layers that take LoRA, the same in every layer."""
    found: dict[str, tuple[int, int]] = {}
    layers = layers_of(model)
    for parent in PARENTS if len(layers) else ():
        module = getattr(layers[0], parent, None)
        for name, child in (module.named_children() if module is not None else ()):
            if isinstance(child, torch.nn.Linear) and name not in EXCLUDED:
                found[name] = (child.in_features, child.out_features)
    return found


def _target_modules(model: torch.nn.Module, targets: dict[str, tuple[int, int]]) -> Iterator[tuple[int, str, torch.nn.Linear]]:
    for index, layer in enumerate(layers_of(model)):
        for parent in PARENTS:
            module = getattr(layer, parent, None)
            for name in targets:
                child = getattr(module, name, None) if module is not None else None
                if isinstance(child, torch.nn.Linear):
                    yield index, name, child


@contextlib.contextmanager
def lora_linears(model: torch.nn.Module, targets: dict[str, tuple[int, int]], mask: torch.Tensor,
                 a: dict[tuple[int, str], torch.Tensor], b: dict[tuple[int, str], torch.Tensor]) -> Iterator[None]:
    """While tracing, every target linear adds its masked low-rank delta from the graph's LoRA inputs
    (`a`, `b` by (layer, target))."""
    patched = []
    for index, name, linear in _target_modules(model, targets):
        def forward(self: torch.nn.Linear, x: torch.Tensor, index: int = index, name: str = name) -> torch.Tensor:
            return F.linear(x, self.weight, self.bias) + ((x @ a[index, name]) * mask) @ b[index, name]

        linear.forward = types.MethodType(forward, linear)
        patched.append(linear)
    try:
        yield
    finally:
        for linear in patched:
            del linear.forward


def example_lora_inputs(num_layers: int, targets: dict[str, tuple[int, int]], num_tokens: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Tracing inputs in graph order (mask, then per layer and target A and B): width 2, small random values."""
    width = 2
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.rand(num_tokens, width, generator=generator).to(dtype)]
    for _ in range(num_layers):
        for fan_in, fan_out in targets.values():
            inputs.append(torch.rand(fan_in, width, generator=generator).to(dtype) * 0.01)
            inputs.append(torch.rand(width, fan_out, generator=generator).to(dtype) * 0.01)
    return inputs


def lora_dynamic_axes(num_layers: int, targets: dict[str, tuple[int, int]]) -> dict[str, dict[int, str]]:
    axes = {LORA_MASK: {0: "num_tokens", 1: "lora_width"}}
    for layer in range(num_layers):
        for target in targets:
            axes[lora_a_name(layer, target)] = {1: "lora_width"}
            axes[lora_b_name(layer, target)] = {0: "lora_width"}
    return axes
