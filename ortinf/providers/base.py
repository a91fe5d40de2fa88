"""Provider: what ortinf knows about one ONNX Runtime execution provider family.

Each family has a module of its own in providers/ that builds one Provider; the registry collects
them and resolves 'auto'. A Provider says how ORT finds it (a plugin library on ORT's device API, or
a provider name built into the installed wheel), where its tensors live (the KV pool is allocated
there), which dtypes and attention kernels it runs, its default options, the pip package that adds
it, and the shape buckets it needs when it compiles per input shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOST = "host"  # tensors in host memory: the pool is a numpy array the graph writes into
DEVICE = "device"  # tensors in the provider's own memory: the pool is an OrtValue allocated there
GRAPH_WRITE = "graph"  # the graph writes K/V into its bound pool (model.onnx)
HOST_WRITE = "host"  # the graph returns new K/V and numpy writes them (model.host-write.onnx; HOST only)


@dataclass(frozen=True, slots=True)
class Buckets:
    """Sizes that the step's variable dimensions are padded up to, so that a provider that compiles
    per input shape compiles a bounded set: num_tokens, num_seqs and the block-table width each take
    the smallest bucket that holds them (beyond the largest: the next multiple of it)."""

    tokens: tuple[int, ...]
    seqs: tuple[int, ...]
    blocks: tuple[int, ...]


_POWERS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
POWER_OF_TWO_BUCKETS = Buckets(tokens=(*_POWERS, 512, 1024, 2048), seqs=_POWERS, blocks=(*_POWERS, 512, 1024))


def bucket(value: int, sizes: tuple[int, ...]) -> int:
    """The smallest size >= value; past the largest, the next multiple of the largest."""
    for size in sizes:
        if value <= size:
            return size
    return -(-value // sizes[-1]) * sizes[-1]


@dataclass(frozen=True, slots=True)
class Provider:
    """One execution provider family as ortinf runs it."""

    name: str  # ortinf's name (--provider)
    ort_name: str  # the ORT execution provider name
    package: str  # the pip package that adds it
    memory: str  # HOST or DEVICE
    kv_write: str = GRAPH_WRITE  # GRAPH_WRITE or HOST_WRITE, whichever measured faster
    device_type: str = "cpu"  # OrtValue device name where DEVICE tensors are allocated
    dtypes: tuple[str, ...] = ("fp32",)
    kernels: tuple[str, ...] = ("portable",)
    options: dict[str, str] = field(default_factory=dict)
    plugin_module: str | None = None  # a Python package carrying a plugin EP library (get_library_path)
    buckets: Buckets | None = None
    max_tensor_bytes: int | None = None  # the largest single tensor it computes on correctly
    max_query_len: dict[str, int] = field(default_factory=dict)  # kernel -> most new tokens per sequence per call it computes right
    no_device_hint: str = ""  # appended to "installed but finds no device"
    # how to install it, as `ortinf providers` and the not-installed error say it (default: pip install <package>)
    install: str = ""
    pip_install: str = ""  # the same for an install from PyPI, where a clone's scripts/ is not at hand
    preload_dlls: bool = False  # call onnxruntime.preload_dlls() first (CUDA/cuDNN from nvidia-* wheels)

    @property
    def install_hint(self) -> str:
        from pathlib import Path

        if self.install.startswith("bash scripts/") and not (Path(__file__).resolve().parents[2] / "scripts").is_dir():
            return self.pip_install or f"pip install {self.package}"
        return self.install or f"pip install {self.package}"
