"""ortinf: a hardware-agnostic LLM inference runtime over ONNX Runtime.

The top-level package stays light on purpose: `import ortinf` must not pull torch (exporting) or the
engine in. Heavy entry points are resolved lazily by attribute access.
"""

from __future__ import annotations

from typing import Any

from ortinf.version import __version__

__all__ = ["LLM", "SamplingParams", "__version__", "export"]


def __getattr__(name: str) -> Any:
    if name == "export":
        from ortinf.exporter.api import export

        return export
    if name == "LLM":
        from ortinf.llm import LLM

        return LLM
    if name == "SamplingParams":
        from ortinf.runtime.sample.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'ortinf' has no attribute {name!r}")
