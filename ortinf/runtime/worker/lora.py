"""LoRA adapters at serving time: PEFT folders read with numpy (no torch), laid side by side in the
graph's LoRA inputs (ortinf/exporter/lora.py has the graph side), one adapter per request.

    slots:    adapter k (0 <= k < max_loras) owns columns [k * max_rank, k * max_rank + its rank)
    a[target] [num_layers, in, max_loras * max_rank]   A^T of each adapter in its columns
    b[target] [num_layers, max_loras * max_rank, out]  B^T in the same rows
    mask      [num_tokens, width]  a token's adapter scale (lora_alpha / r) on its columns, else 0

The graph takes each layer's slice as its own input (lora_a.{layer}.{target}); the slices are
contiguous views of these arrays, bound once (DecoderGraph.lora) and read in place on the CPU.
Loading writes an adapter's columns in place; unloading zeroes them; only the mask changes per step. A package exported without --enable-lora has
no LoRA inputs: adapters are refused with the command that makes one that has.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ortinf import json_text
from ortinf.errors import ConfigError
from ortinf.manifest import DecoderSpec, lora_a_name, lora_b_name

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64}
BASE = -1  # the slot of a token that runs the base model
# Every token multiplies every loaded adapter's columns (by 0 when they are not its own), and NaN * 0
# is NaN: one adapter with a non-finite weight, or one large enough for x @ A to overflow, would
# corrupt the whole batch. Trained LoRA weights are far below this bound.
MAX_ABS_WEIGHT = 1e4


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as a float32 numpy array (F32, F16, BF16, F64)."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8:
        raise ValueError(f"its header claims {length} bytes, more than the file holds")
    header = json_text.loads(data[8 : 8 + length])
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    body = len(data) - 8 - length
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if not 0 <= start <= end <= body:
            raise ValueError(f"tensor {name}'s data offsets lie outside the file")
        raw = data[8 + length + start : 8 + length + end]
        kind = info["dtype"]
        if kind not in _SAFETENSORS_DTYPES:
            raise ConfigError(f"{path}: tensor {name} is {kind}; LoRA weights must be F32, F16 or BF16")
        if kind == "BF16":
            array = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.frombuffer(raw, dtype=_SAFETENSORS_DTYPES[kind]).astype(np.float32)
        tensors[name] = array.reshape(info["shape"])
    return tensors


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """One PEFT LoRA adapter: per (layer, target) its A [r, in] and B [out, r], and its scale."""

    name: str
    path: Path
    rank: int
    scale: float
    weights: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]

    @classmethod
    def load(cls, name: str, folder: str | Path, spec: DecoderSpec) -> LoraAdapter:
        """Reads and checks a PEFT folder against the package; every problem is a one-line ConfigError."""
        try:  # "~nosuchuser/x" (no such home), a name over 255 bytes: the client's path, not a server error
            folder = Path(folder).expanduser()
            present = (folder / ADAPTER_CONFIG).is_file() and (folder / ADAPTER_WEIGHTS).is_file()
        except (OSError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"LoRA '{name}': {str(folder)[:200]} is not a usable path ({exc})") from exc
        if not present:
            raise ConfigError(f"LoRA '{name}': {folder} is not a PEFT adapter folder (it needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
        try:  # strict JSON: deep nesting and NaN/Infinity are ValueErrors (ortinf/json_text.py)
            config = json_text.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
            tensors = read_safetensors(folder / ADAPTER_WEIGHTS)
        except (OSError, ValueError, KeyError, TypeError, OverflowError, MemoryError, struct.error) as exc:
            raise ConfigError(f"LoRA '{name}': {folder} is unreadable ({str(exc)[:200]})") from exc
        if not isinstance(config, dict):
            raise ConfigError(f"LoRA '{name}': {ADAPTER_CONFIG} must hold a JSON object")
        if config.get("peft_type", "LORA") != "LORA":
            raise ConfigError(f"LoRA '{name}': {folder} is a {config.get('peft_type')} adapter; only LoRA is served")
        if config.get("use_dora"):
            raise ConfigError(f"LoRA '{name}': DoRA adapters are not supported; merge it into the model and export that")
        try:
            rank, alpha = int(config.get("r", 0)), float(config.get("lora_alpha", config.get("r", 0)))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ConfigError(f"LoRA '{name}': {ADAPTER_CONFIG} has a non-numeric r or lora_alpha") from exc
        if rank <= 0:
            raise ConfigError(f"LoRA '{name}': {ADAPTER_CONFIG} has no positive rank r")
        if not math.isfinite(alpha) or abs(alpha) > MAX_ABS_WEIGHT:
            raise ConfigError(f"LoRA '{name}': lora_alpha {alpha} is not a finite scale")
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        weights: dict[tuple[int, str], list] = {}
        for key, array in tensors.items():
            match = _KEY.search(key)
            if match is None:
                raise ConfigError(f"LoRA '{name}': weight {key} is not a LoRA A/B matrix of a layer's projection "
                                  "(embeddings, heads and modules_to_save are not served)")
            layer, target, which = int(match[1]), match[2], match[3]
            if target not in spec.lora_targets:
                raise ConfigError(f"LoRA '{name}' adapts {target}, which this package has no LoRA input for "
                                  f"(it has {', '.join(spec.lora_targets)})")
            if layer >= spec.num_layers:
                raise ConfigError(f"LoRA '{name}' has layer {layer}; the model has {spec.num_layers}")
            if not np.isfinite(array).all() or np.abs(array).max(initial=0.0) > MAX_ABS_WEIGHT:
                raise ConfigError(f"LoRA '{name}': {key} holds non-finite or huge values (|w| > {MAX_ABS_WEIGHT:g}); "
                                  "loaded, it would corrupt every request in the batch")
            fan_in, fan_out = spec.lora_targets[target]
            expected = (rank, fan_in) if which == "A" else (fan_out, rank)
            if tuple(array.shape) != expected:
                raise ConfigError(f"LoRA '{name}': {key} is {list(array.shape)}, expected {list(expected)} "
                                  "(an adapter trained for another model?)")
            weights.setdefault((layer, target), [None, None])[0 if which == "A" else 1] = array
        incomplete = [k for k, (a, b) in weights.items() if a is None or b is None]
        if incomplete:
            raise ConfigError(f"LoRA '{name}': layer {incomplete[0][0]} {incomplete[0][1]} has only one of lora_A and lora_B")
        return cls(name, folder, rank, scale, {k: (a, b) for k, (a, b) in weights.items()})


class LoraSlots:
    """The loaded adapters, laid out as the graph's LoRA inputs (see the module docstring)."""

    def __init__(self, spec: DecoderSpec, max_loras: int = 0, max_rank: int = 16, dtype: type = np.float32) -> None:
        if not spec.lora_targets and max_loras:
            raise ConfigError("this package has no LoRA inputs: re-export it with `ortinf export --enable-lora` to serve adapters")
        if max_loras < 0 or max_rank < 1:
            raise ConfigError(f"max_loras must be >= 0 and max_lora_rank >= 1 (got {max_loras}, {max_rank})")
        self.spec, self.max_loras, self.max_rank = spec, max_loras, max_rank
        width = max(1, max_loras * max_rank)  # one zero column when no adapter can load
        layers = spec.num_layers
        self.a = {t: np.zeros((layers, i, width), dtype) for t, (i, _) in spec.lora_targets.items()}
        self.b = {t: np.zeros((layers, width, o), dtype) for t, (_, o) in spec.lora_targets.items()}
        self.dtype = dtype
        self.adapters: dict[str, LoraAdapter] = {}
        self.slots: dict[str, int] = {}

    @property
    def width(self) -> int:
        return max(1, self.max_loras * self.max_rank)

    def add(self, adapter: LoraAdapter) -> None:
        """Writes an adapter into a free slot; ConfigError when its name is taken, its rank is above
        max_lora_rank or every slot is in use."""
        if adapter.name in self.adapters:
            raise ConfigError(f"a LoRA adapter named '{adapter.name}' is already loaded")
        if adapter.rank > self.max_rank:
            raise ConfigError(f"LoRA '{adapter.name}' has rank {adapter.rank}, above max_lora_rank {self.max_rank}: raise --max-lora-rank")
        free = sorted(set(range(self.max_loras)) - set(self.slots.values()))
        if not free:
            raise ConfigError(f"all {self.max_loras} LoRA slots are in use: unload one, or raise --max-loras")
        slot = free[0]
        columns = slice(slot * self.max_rank, slot * self.max_rank + adapter.rank)
        for (layer, target), (a, b) in adapter.weights.items():
            self.a[target][layer, :, columns] = a.T
            self.b[target][layer, columns, :] = b.T
        self.adapters[adapter.name], self.slots[adapter.name] = adapter, slot

    def remove(self, name: str) -> None:
        if name not in self.adapters:
            raise ConfigError(f"no LoRA adapter named '{name}' is loaded")
        slot = self.slots.pop(name)
        del self.adapters[name]
        columns = slice(slot * self.max_rank, (slot + 1) * self.max_rank)
        for target in self.a:
            self.a[target][:, :, columns] = 0
            self.b[target][:, columns, :] = 0

    def slot(self, name: str | None) -> int:
        """The slot of a loaded adapter, BASE for None; ConfigError for an unknown name."""
        if name is None:
            return BASE
        if name not in self.slots:
            raise ConfigError(f"no LoRA adapter named '{name}' is loaded")
        return self.slots[name]

    def mask(self, token_slots: np.ndarray) -> np.ndarray:
        """[num_tokens, width]: each token's adapter scale on its adapter's columns, 0 elsewhere."""
        mask = np.zeros((len(token_slots), self.width), self.dtype)
        for name, slot in self.slots.items():
            rows = token_slots == slot
            if rows.any():
                start = slot * self.max_rank
                mask[rows, start : start + self.adapters[name].rank] = self.adapters[name].scale
        return mask

    def weights(self) -> dict[str, np.ndarray]:
        """The graph's A/B inputs by name: contiguous per-layer views of the arrays (bind them once)."""
        weights = {}
        for target in self.a:
            for layer in range(self.spec.num_layers):
                weights[lora_a_name(layer, target)] = self.a[target][layer]
                weights[lora_b_name(layer, target)] = self.b[target][layer]
        return weights
