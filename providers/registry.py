"""Execution providers: one small entry per provider, and the one place 'auto' is resolved.

Each entry says which ORT provider it is, its default options, and which dtypes it runs. The KV pool
lives in host memory (numpy) for all of them for now; device-resident pools come with IOBinding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import onnxruntime as ort

from ortinf.errors import ProviderUnavailableError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """One ORT execution provider as ortinf uses it."""

    name: str
    ort_name: str
    dtypes: tuple[str, ...]
    options: dict[str, str] = field(default_factory=dict)


PROVIDERS: dict[str, ProviderSpec] = {
    spec.name: spec
    for spec in (
        ProviderSpec("cuda", "CUDAExecutionProvider", ("fp32", "fp16")),
        ProviderSpec("migraphx", "MIGraphXExecutionProvider", ("fp32", "fp16")),
        ProviderSpec("rocm", "ROCMExecutionProvider", ("fp32", "fp16")),  # onnxruntime-rocm < 1.23
        ProviderSpec("dml", "DmlExecutionProvider", ("fp32", "fp16")),
        ProviderSpec("openvino", "OpenVINOExecutionProvider", ("fp32", "fp16"), {"device_type": "CPU"}),
        ProviderSpec("coreml", "CoreMLExecutionProvider", ("fp32",)),
        ProviderSpec("cpu", "CPUExecutionProvider", ("fp32", "fp16")),
    )
}

# 'auto' takes the first available provider in this order: accelerators first, CPU last.
AUTO_ORDER = ("cuda", "migraphx", "rocm", "dml", "openvino", "coreml", "cpu")


def available() -> list[str]:
    """ortinf names of the providers this onnxruntime build offers."""
    offered = set(ort.get_available_providers())
    return [name for name, spec in PROVIDERS.items() if spec.ort_name in offered]


def resolve(name: str) -> ProviderSpec:
    """The provider for `name` ('auto' or one of PROVIDERS); raises if this install lacks it."""
    have = available()
    if name == "auto":
        chosen = next(n for n in AUTO_ORDER if n in have)
        log.info("provider auto -> %s (available: %s)", chosen, ", ".join(have))
        return PROVIDERS[chosen]
    if name not in PROVIDERS:
        raise ProviderUnavailableError(f"unknown provider '{name}': choose one of auto, {', '.join(PROVIDERS)}")
    if name not in have:
        raise ProviderUnavailableError(
            f"provider '{name}' is not in this onnxruntime build (available: {', '.join(have)}); "
            f"install the onnxruntime package that carries it"
        )
    return PROVIDERS[name]
