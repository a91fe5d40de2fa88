"""The exporter's quantizer in the kernel library (ortinf/kernels/cpu/quantize.cc, issue 55): MatMulNBits' B and scales
bit for bit what quantize.py's numpy rounding gives, for int8 and int4, whole and partial blocks, all-zero blocks,
ties of magnitude, values already on the grid (exact), and a transposed view read in place through its strides."""

from __future__ import annotations

import numpy as np
import pytest

from ortinf.exporter.quantize import matmul_nbits_tensors, nbits_tensors, quantize_weight
from ortinf.kernels import library

pytestmark = pytest.mark.skipif(library.function("ortinf_quantize_nbits") is None,
                                reason="the kernel library is not built (python -m ortinf.kernels.build)")


def _numpy(w: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray, bool]:
    qw = quantize_weight(np.ascontiguousarray(w), bits, block)
    b, scales = matmul_nbits_tensors(qw)
    return b, scales, qw.exact


@pytest.mark.parametrize("bits,block", [(8, 128), (8, 32), (4, 32), (4, 128)])
@pytest.mark.parametrize("k,n", [(256, 96), (100, 37), (8, 3)])
def test_native_rounding_is_numpys(bits, block, k, n):
    rng = np.random.default_rng(k * n + bits)
    stored = rng.normal(0, 0.05, size=(n, k)).astype(np.float32)  # a checkpoint's [N, K] rows
    stored[0, :block] = 0.0  # an all-zero block
    stored[1, :block] = -0.0
    stored[2, :2] = [0.25, -0.25]  # a tie of magnitude: the first one sets the int4 scale's sign
    stored[2, 2:min(k, block)] = 0.01
    view = stored.T  # [K, N], read through its strides
    b, scales, exact = nbits_tensors(view, bits, block)
    want_b, want_scales, want_exact = _numpy(view, bits, block)
    assert b.shape == want_b.shape and np.array_equal(b, want_b)
    assert np.array_equal(scales.view(np.int32), want_scales.view(np.int32))  # the same bits, signed zeros included
    assert exact == want_exact is False


@pytest.mark.parametrize("bits", [8, 4])
def test_values_on_the_grid_come_back_exactly(bits):
    """A Q8_0/Q4_0 GGUF's weights are codes times a scale: the rounding keeps them (exact), as numpy's does."""
    rng = np.random.default_rng(bits)
    low, high = (-127, 127) if bits == 8 else (-8, 7)
    codes = rng.integers(low, high + 1, size=(64, 24)).astype(np.float32)
    codes[0::32] = low if bits == 4 else high  # each block's extreme sets its scale
    weights = codes * np.float32(0.125)
    b, scales, exact = nbits_tensors(weights, bits, 32)
    assert exact and _numpy(weights, bits, 32)[2]
    assert np.array_equal(b, _numpy(weights, bits, 32)[0])


def test_without_the_library_numpy_gives_the_same(monkeypatch):
    weights = np.random.default_rng(0).normal(size=(96, 40)).astype(np.float32)
    native = nbits_tensors(weights, 4, 32)
    monkeypatch.setattr(library, "function", lambda name: None)
    fallback = nbits_tensors(weights, 4, 32)
    assert all(np.array_equal(a, b) for a, b in zip(native[:2], fallback[:2])) and native[2] == fallback[2]
