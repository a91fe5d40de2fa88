"""EngineConfig: every engine setting, built once and frozen; CLI options map 1:1 onto its fields. SpeculativeConfig,
its speculative_config, lives here too: a setting, read by the scheduler and the draft proposer, so that config.py
imports nothing of the runtime (it sits below runtime/sample, which reads it)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ortinf.errors import ConfigError

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def option(default, help: str, section: str, **cli):  # noqa: A002 - a dataclass field
    """A field that is also a command-line option: `help` its text, `section` where `--help` lists it
    (cache, scheduler, speculative, lora, device), `cli` how the CLI spells and reads it when it is not the
    field's own name and type: flag, multiple, metavar, choices ({word: value}), parse (a function of the
    raw values), minimum. ortinf/cli/serve_options.py makes the options of serve, generate, chat and
    transcribe from these, so a setting is declared once."""
    metadata = {"cli": help, "section": section, **cli}
    if default is dict:  # a fresh mapping per config
        return field(default_factory=dict, metadata=metadata)
    return field(default=default, metadata=metadata)


SPECULATIVE_METHODS = ("ngram", "draft_model")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """vLLM's speculative_config: "ngram" (prompt lookup), or "draft_model" with `model` (a package
    folder, or a Hugging Face folder, with the target's tokenizer; vLLM infers the method from `model`)."""

    method: str = "ngram"
    model: str | None = None
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    disable_by_batch_size: int | None = None  # no proposals while more requests than this are running (vLLM's option)

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ConfigError(f"speculative method '{self.method}' is not supported: use one of {', '.join(SPECULATIVE_METHODS)}")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"speculative_config.{name} must be a positive integer, got {value!r}")
        if self.disable_by_batch_size is not None and (isinstance(self.disable_by_batch_size, bool)
                                                       or not isinstance(self.disable_by_batch_size, int) or self.disable_by_batch_size < 1):
            raise ConfigError(f"speculative_config.disable_by_batch_size must be a positive integer, got {self.disable_by_batch_size!r}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ConfigError(f"speculative_config.model must be a package folder's path, got {self.model!r}")
        if (self.method == "draft_model") != (self.model is not None):
            raise ConfigError("speculative_config: the draft_model method needs `model` (a draft package folder), and only it takes one")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError("speculative_config.prompt_lookup_min must not exceed prompt_lookup_max")
        if self.num_speculative_tokens > 16:
            raise ConfigError("speculative_config.num_speculative_tokens must be at most 16")

    @classmethod
    def parse(cls, value: str | dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """From JSON text or a dict (vLLM's keys); None stays None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ConfigError(f"speculative_config is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ConfigError("speculative_config must be a JSON object such as {\"method\": \"ngram\", \"num_speculative_tokens\": 4}")
        known = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"speculative_config: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "model" in value and "method" not in value:
            value = {**value, "method": "draft_model"}
        return cls(**value)


_AUTO_ON_OFF = {"auto": None, "on": True, "off": False}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Settings of one engine over one package, every kind (text decoders, Marian/BART, Whisper); each
    field is a CLI option (`option`), and `LLM(package, **fields)` takes them."""

    package_dir: Path
    # device
    provider: str = option("auto", "Execution provider: auto, cpu, webgpu, openvino, cuda, ... (see `ortinf providers`).", "device")
    provider_options: dict[str, str] = option(dict, "An option of the execution provider (repeatable), e.g. device_type=GPU for "
                                              "OpenVINO.", "device", flag="--provider-option", multiple=True, metavar="KEY=VALUE",
                                              parse=lambda values: _provider_options(values))
    allow_cpu_fallback: bool = option(False, "Run on the CPU when the chosen provider runs none of the graph, instead of failing.",
                                      "device")
    shape_buckets: bool | None = option(None, "Pad each step to a few bucket shapes (for providers that compile per shape); auto: "
                                        "the provider's choice.", "device", choices=_AUTO_ON_OFF)
    cpu_kernel: bool | None = option(None, "On the CPU provider, run the package's graph for ortinf's compiled kernel library (fused "
                                     "paged attention); auto: when the package has it and the library loads, off: the portable "
                                     "graph, on: fail without it.", "device", choices=_AUTO_ON_OFF)
    intra_op_threads: int = option(0, "ORT threads per session (0: all cores).", "device", minimum=0)
    bf16_math: str = option("bf16", "Arithmetic of a bf16 package's matrix products on the CPU kernel library: bf16 rounds the "
                            "activations to bf16 and sums the exact products in fp32, as PyTorch's bf16 inference does (on "
                            "AVX512_BF16 CPUs with vdpbf16ps: prompts and batches 2.3x faster); fp32 keeps the activations in "
                            "fp32 (fp32 math on the bf16 weights, slower).", "device", choices={"bf16": "bf16", "fp32": "fp32"})
    # cache
    block_size: int = option(16, "Tokens per KV-cache block.", "cache")
    num_blocks: int | None = option(None, "KV-cache blocks per model [default: from --kv-cache-memory].", "cache")
    kv_cache_memory: int | str | None = option(None, "KV cache size, e.g. 2GiB [default: 20% of free RAM, capped at what "
                                               "--max-num-seqs full-length sequences need].", "cache", metavar="SIZE")
    enable_prefix_caching: bool = option(True, "Reuse the KV blocks of prompt prefixes seen before.", "cache")
    prefix_cache_dir: str | None = option(None, "Keep the prefix cache's full blocks on disk in DIR too: a restart (or another "
                                          "server of the same package on the same folder, running or not) restores a long "
                                          "prompt's K/V instead of prefilling it (host KV pools: the CPU and OpenVINO "
                                          "providers). Blocks are checksummed, not authenticated: whoever can write DIR can "
                                          "change the replies.", "cache", metavar="DIR")
    prefix_cache_disk: int | str = option(4 << 30, "Disk the whole --prefix-cache-dir folder may take, every package's blocks "
                                          "together; the least recently used go first, so a package no longer served "
                                          "loses its blocks first.", "cache", shown="4GiB", parse=lambda value: parse_size(value), metavar="SIZE")
    # scheduler
    max_num_seqs: int = option(64, "Most sequences in one batch (Whisper: windows; Marian, BART: sources).", "scheduler")
    max_num_batched_tokens: int = option(2048, "Token budget of one engine step.", "scheduler")
    max_num_encoder_input_tokens: int = option(6144, "Encoder positions run per engine step by encoder-decoders (Whisper: 1500 a "
                                               "window; Marian, BART: a source's tokens) and image tokens by vision-language "
                                               "models' vision graph (an image larger runs alone).", "scheduler")
    max_model_len: int | None = option(None, "Context length cap (prompt + output) [default: the model's].", "scheduler")
    seed: int | None = option(None, "Seed of the engine's shared sampler (requests without a seed).", "scheduler", minimum=0)
    scheduling_policy: str = option("fcfs", "Which waiting request runs first: fcfs (arrival order) or priority (a request's "
                                    "`priority`, lower first, then arrival; under memory pressure the least urgent running "
                                    "request is preempted), as vLLM's.", "scheduler",
                                    choices={"fcfs": "fcfs", "priority": "priority"})
    # speculative
    speculative_config: SpeculativeConfig | dict | str | None = option(
        None, 'Speculative decoding, vLLM\'s speculative_config: \'{"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 4}\' (n-gram prompt lookup) or \'{"model": "draft-pkg/", "num_speculative_tokens": 3}\' (a '
        'smaller package with the same tokenizer). Greedy output is unchanged.', "speculative", metavar="JSON")
    # lora
    lora_modules: dict[str, str] = option(dict, "A LoRA adapter (a PEFT folder) served as model NAME on the first text-generation "
                                          "package, which must be exported with --enable-lora; repeat for more. Requests pick one "
                                          "by `model`, and adapters and the base model batch together.", "lora",
                                          multiple=True, metavar="NAME=PATH", parse=lambda values: parse_lora_modules(values))
    max_loras: int = option(0, "LoRA adapters loaded at once (slots) [default: as many as --lora-modules; raise it to load more "
                               "at runtime].", "lora", minimum=0)
    max_lora_rank: int = option(16, "Highest LoRA rank an adapter may have.", "lora")

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))
        if isinstance(self.kv_cache_memory, str):  # the same sizes as --kv-cache-memory
            object.__setattr__(self, "kv_cache_memory", parse_size(self.kv_cache_memory))
        if isinstance(self.prefix_cache_disk, str):
            object.__setattr__(self, "prefix_cache_disk", parse_size(self.prefix_cache_disk))
        if not isinstance(self.prefix_cache_disk, int) or isinstance(self.prefix_cache_disk, bool) or self.prefix_cache_disk < 1:
            raise ConfigError(f"prefix_cache_disk must be a positive number of bytes or a size such as 8GiB, got {self.prefix_cache_disk!r}")
        if self.bf16_math not in ("bf16", "fp32"):
            raise ConfigError(f"bf16_math must be bf16 or fp32, got {self.bf16_math!r}")
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


def proc_bytes(path: str, key: str) -> int | None:
    """A `key: N kB` line of a Linux /proc file, in bytes (None where there is none)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_memory() -> int:
    """Bytes of RAM available now (MemAvailable), or total RAM where /proc is missing."""
    found = proc_bytes("/proc/meminfo", "MemAvailable")
    return found if found is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _provider_options(values) -> dict[str, str]:
    from ortinf.providers.registry import parse_options

    return parse_options(values)


def parse_lora_modules(values) -> dict[str, str]:
    """NAME=PATH ... (--lora-modules) -> {name: path}; a malformed or repeated NAME, or a PATH that is no
    folder, is a ConfigError."""
    modules: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ConfigError(f"--lora-modules takes NAME=PATH (a PEFT adapter folder), got {value!r}")
        if name in modules:
            raise ConfigError(f"--lora-modules names '{name}' twice")
        if not Path(path).expanduser().is_dir():
            raise ConfigError(f"--lora-modules {name}: {path} is not a folder (pass a PEFT adapter folder)")
        modules[name.strip()] = str(Path(path).expanduser())
    return modules
