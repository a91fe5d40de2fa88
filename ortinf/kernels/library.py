"""ortinf's compiled kernel library for ONNX Runtime's CPU provider: where it is, whether it loads,
and registering it into a session.

The library (ortinf/kernels/cpu/, built by ortinf/kernels/build.py) holds the custom ops `ortinf.PagedAttention`
and `ortinf.QMatMul` (int8/int4 weights against per-token quantized activations).
Packages carry a graph that uses it (`model.cpu.onnx`, manifest `cpu_kernel`) beside the portable
one; the runtime runs that graph on the CPU provider when the library loads, and the portable graph
otherwise, saying so once in the log. Torch-free: the serving install imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

log = logging.getLogger(__name__)

DOMAIN = "ortinf"
LIB_NAME = "libortinf_kernels.so"
ENV_PATH = "ORTINF_KERNELS_LIB"  # a library elsewhere, or "off" to run the portable kernel


@dataclass(frozen=True, slots=True)
class KernelLibrary:
    """A library that loaded into this onnxruntime, and the instruction set its jobs run with."""

    path: Path
    isa: str


@functools.cache
def load() -> KernelLibrary | None:
    """The library when it exists and ORT accepts it; None (logged once, with the reason) otherwise.
    ORTINF_KERNELS_LIB names a library elsewhere, or is "off"."""
    configured = os.environ.get(ENV_PATH, "")
    if configured.lower() == "off":
        log.info("CPU kernel library switched off (%s=off): CPU packages run the portable kernel", ENV_PATH)
        return None
    path = Path(configured) if configured else Path(__file__).resolve().parent / "lib" / LIB_NAME
    if not path.is_file():
        log.warning("ortinf's CPU kernel library is not built (%s): CPU packages run the portable kernel, which is "
                    "slower; build it with `python -m ortinf.kernels.build`", path)
        return None
    try:
        ort.SessionOptions().register_custom_ops_library(str(path))
        isa = _isa(path)
    except Exception as exc:  # noqa: BLE001 - a library from another ORT or CPU: fall back, never crash
        log.warning("ortinf's CPU kernel library %s does not load into onnxruntime %s (%s): CPU packages run the "
                    "portable kernel", path, ort.__version__, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        return None
    return KernelLibrary(path, isa)


def _isa(path: Path) -> str:
    """The instruction set the library chose for this CPU (avx512, avx2 or generic)."""
    library = ctypes.CDLL(str(path))
    if not hasattr(library, "ortinf_kernels_isa"):
        return "unknown"
    library.ortinf_kernels_isa.restype = ctypes.c_char_p
    return library.ortinf_kernels_isa().decode()


def qmatmul_isa() -> str:
    """The instruction set ortinf.QMatMul runs with (avx512vnni, avxvnni, avx2 or generic); "" without the library."""
    return _reported("ortinf_qmatmul_isa")


def panel_gemm_isa() -> str:
    """The instruction set ortinf.BMatMul and ortinf.MoE's fp32 experts run with (avx512, avx2 or generic); "" without the library."""
    return _reported("ortinf_panel_gemm_isa")


def _reported(symbol: str) -> str:
    library = load()
    if library is None:
        return ""
    lib = ctypes.CDLL(str(library.path))
    if not hasattr(lib, symbol):
        return "unknown"
    getattr(lib, symbol).restype = ctypes.c_char_p
    return getattr(lib, symbol)().decode()


BF16_MATHS = ("bf16", "fp32")
BF16_MATH_ENTRY = "ortinf.bf16_math"  # read by RegisterCustomOps (bmatmul.cc's read_bf16_math)


def register(options: ort.SessionOptions, bf16_math: str = "bf16") -> KernelLibrary | None:
    """Registers the library into `options` when it loads; returns it (None: not registered). `bf16_math`: the
    arithmetic of BMatMul (bf16 weights) in sessions of these options: "bf16" rounds the activations to bf16 (vdpbf16ps
    where the CPU has AVX512_BF16), "fp32" keeps them in fp32 (bmatmul.cc's header)."""
    library = load()
    if library is not None:
        set_bf16_math(options, bf16_math)
        options.register_custom_ops_library(str(library.path))
    return library


def set_bf16_math(options: ort.SessionOptions, bf16_math: str) -> None:
    """The config entry the library reads when it is registered into `options` (so: before registering it)."""
    if bf16_math not in BF16_MATHS:
        raise ValueError(f"bf16_math must be one of {', '.join(BF16_MATHS)}, got {bf16_math!r}")
    options.add_session_config_entry(BF16_MATH_ENTRY, bf16_math)


def describe() -> str:
    """One line for `ortinf providers` / `inspect`: which CPU attention kernel runs."""
    library = load()
    if library is None:
        return "portable (ortinf's kernel library is not loaded)"
    return (f"ortinf.PagedAttention ({library.isa}), ortinf.QMatMul ({qmatmul_isa()}), ortinf.BMatMul ({panel_gemm_isa()}), "
            f"{library.path.name}")


@functools.cache
def function(name: str) -> ctypes._CFuncPtr | None:
    """A C function the library exports for Python's own use (ctypes), or None where the library is not built or is
    older than the function (the caller then takes its numpy route). The exporter's quantizer:
    `ortinf_quantize_nbits` (ortinf/kernels/cpu/quantize.cc)."""
    found = load()
    if found is None:
        return None
    try:
        return getattr(ctypes.CDLL(str(found.path)), name)
    except (OSError, AttributeError):
        return None


_write_stores = True


def flush_packed() -> list[str]:
    """Writes the packed-weight store of every package whose kernels packed their weights at the session just made
    (ortinf/kernels/cpu/packed_store.h: the next load maps it instead of packing) and returns one line per package:
    what was mapped, packed and written. Empty where the library is older or nothing was packed or mapped. Inside
    `temporary_packages()` nothing is written (what was packed is dropped)."""
    flush = function("ortinf_packed_flush")
    if flush is None:
        return []
    flush.restype = ctypes.c_char_p
    flush.argtypes = [ctypes.c_int]
    return flush(int(_write_stores)).decode(errors="replace").splitlines()


@contextlib.contextmanager
def temporary_packages() -> Iterator[None]:
    """Sessions made inside write no packed-weight store: their packages are removed after (the exporter's
    verification windows), so writing one would cost a write of their weights for nothing."""
    global _write_stores
    before, _write_stores = _write_stores, False
    try:
        yield
    finally:
        _write_stores = before


def forget_packed() -> None:
    """Closes the library's record of opened stores (a test that rewrites a store in place, then loads again)."""
    forget = function("ortinf_packed_forget")
    if forget is not None:
        forget()
