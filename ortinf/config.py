"""EngineConfig: every engine setting, built once and frozen; CLI options map 1:1 onto its fields."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ortinf.errors import ConfigError
from ortinf.sample.speculative import SpeculativeConfig

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Settings of one engine over one decoder package."""

    package_dir: Path
    provider: str = "auto"
    # fields with a "cli" help text become `ortinf serve` options generated from here (ortinf/cli/main.py
    # engine_options); the others have hand-written serve options (their CLI spelling differs)
    block_size: int = field(default=16, metadata={"cli": "Tokens per KV-cache block."})
    num_blocks: int | None = field(default=None, metadata={"cli": "KV-cache blocks per model [default: from --kv-cache-memory]."})
    kv_cache_memory: int | str | None = None  # bytes, or a size as the CLI takes it ("256MiB", "4GiB")
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_num_encoder_input_tokens: int = field(default=6144, metadata={"cli": "Encoder positions run per engine step by "
                                              "encoder-decoders (Whisper: 1500 a window; Marian, BART: a source's tokens)."})
    max_model_len: int | None = field(default=None, metadata={"cli": "Context length cap (prompt + output) [default: the model's]."})
    enable_prefix_caching: bool = field(default=True, metadata={"cli": "Reuse the KV blocks of prompt prefixes seen before."})
    intra_op_threads: int = 0
    seed: int | None = field(default=None, metadata={"cli": "Seed of the engine's shared sampler (requests without a seed)."})
    provider_options: dict[str, str] = field(default_factory=dict)
    allow_cpu_fallback: bool = False
    shape_buckets: bool | None = None  # pad steps to bucket shapes; None: the provider's choice
    cpu_kernel: bool | None = None  # ortinf's CPU kernel library on the CPU provider; None: when it loads (DecoderGraph)
    speculative_config: SpeculativeConfig | dict | str | None = None  # vLLM's; e.g. {"method": "ngram", "num_speculative_tokens": 4}
    lora_modules: dict[str, str] = field(default_factory=dict)  # adapter name -> PEFT folder, loaded at start
    max_loras: int = field(default=0, metadata={"cli": "LoRA adapters loaded at once (slots) [default: as many as --lora-modules; "
                                                        "raise it to load more at runtime]."})
    max_lora_rank: int = field(default=16, metadata={"cli": "Highest LoRA rank an adapter may have."})

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))
        if isinstance(self.kv_cache_memory, str):  # the same sizes as --kv-cache-memory
            object.__setattr__(self, "kv_cache_memory", parse_size(self.kv_cache_memory))
        if self.lora_modules and self.max_loras < len(self.lora_modules):
            object.__setattr__(self, "max_loras", len(self.lora_modules))
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_num_encoder_input_tokens", "max_lora_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("num_blocks", "kv_cache_memory", "max_model_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                what = "a positive number of bytes or a size such as 256MiB" if name == "kv_cache_memory" else "a positive integer"
                raise ConfigError(f"{name} must be {what}, got {value!r}")


def parse_size(text: str) -> int:
    """'4GiB', '512MB', '1073741824' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"cannot read the size {text!r}: write e.g. 4GiB, 512MiB or a number of bytes")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def available_memory() -> int:
    """Bytes of RAM available now (MemAvailable), or total RAM where /proc is missing."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
