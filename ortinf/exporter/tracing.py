"""What every traced graph shares: the opset and a tracer that keeps its warnings to itself."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

# Opset 17: LayerNormalization as one op, and what every provider ortinf targets implements.
OPSET = 17


@contextlib.contextmanager
def quiet_tracing() -> Iterator[None]:
    """Silences the tracer's warnings: export verification checks the graph, not the warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def no_graph_shape_inference() -> Iterator[None]:
    """Skips the TorchScript exporter's two whole-graph ONNX shape-inference passes (before and after
    constant folding): they only annotate intermediate values with shapes, which ONNX Runtime infers
    itself when it loads the graph, and they took 21 s of a 0.5B-shaped llama's 64 s of tracing (four
    passes over two traces). Each node's own inference while it is converted still runs."""
    original = torch._C._jit_pass_onnx_graph_shape_type_inference
    torch._C._jit_pass_onnx_graph_shape_type_inference = lambda graph, params, opset: None
    try:
        yield
    finally:
        torch._C._jit_pass_onnx_graph_shape_type_inference = original
