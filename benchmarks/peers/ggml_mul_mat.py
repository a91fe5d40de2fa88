"""llama.cpp's ggml matrix products timed on their own, as llama.cpp runs them: weights allocated in the CPU
backend's extra buffer type where it takes them (the load-time repack into interleaved tiles, Q4_0 -> 8x8 on
AVX2/AVX-512), the plain CPU buffer otherwise, one CPU backend with a fixed thread count, one graph of several
ggml_mul_mat nodes over the same activation rows (as benchmarks/qmatmul.py times ortinf's op).

Runs in the llama.cpp benchmark environment (benchmarks/peers/install_llama_cpp.sh) through the ggml libraries
llama-cpp-python ships, driven with ctypes; benchmarks/qmatmul.py starts it. Reads one JSON request on stdin:
{"cells": [{"k": K, "n": N, "type": "q4_0" | "q8_0" | "bf16" | "f32", "rows": [1, 2, ...]}], "weights": W,
"repeats": R, "threads": T} and writes {"ms": [[ms per call for each row count] per cell], "repacked": [...]}.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np

LIB = Path(llama_cpp.__file__).parent / "lib"
TYPES = {"f32": 0, "q4_0": 2, "q8_0": 8, "bf16": 30}
CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def load():
    base = ctypes.CDLL(str(LIB / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    ggml = ctypes.CDLL(str(LIB / "libggml.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(LIB / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    p, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    signatures = {
        (base, "ggml_init"): (p, [InitParams]), (base, "ggml_free"): (None, [p]),
        (base, "ggml_new_tensor_2d"): (p, [p, ctypes.c_int, i64, i64]), (base, "ggml_mul_mat"): (p, [p, p, p]),
        (base, "ggml_new_graph"): (p, [p]), (base, "ggml_build_forward_expand"): (None, [p, p]),
        (base, "ggml_tensor_overhead"): (sz, []), (base, "ggml_graph_overhead"): (sz, []),
        (base, "ggml_row_size"): (sz, [ctypes.c_int, i64]),
        (base, "ggml_quantize_chunk"): (sz, [ctypes.c_int, p, p, i64, i64, i64, p]),
        (ggml, "ggml_backend_dev_by_type"): (p, [ctypes.c_int]), (ggml, "ggml_backend_dev_backend_reg"): (p, [p]),
        (ggml, "ggml_backend_reg_get_proc_address"): (p, [p, ctypes.c_char_p]),
        (ggml, "ggml_backend_dev_supports_op"): (ctypes.c_bool, [p, p]),
        (base, "ggml_backend_buft_name"): (ctypes.c_char_p, [p]),
        (base, "ggml_backend_alloc_ctx_tensors_from_buft"): (p, [p, p]),
        (base, "ggml_backend_tensor_set"): (None, [p, p, sz, sz]),
        (base, "ggml_backend_graph_compute"): (ctypes.c_int, [p, p]), (base, "ggml_backend_buffer_free"): (None, [p]),
        (cpu, "ggml_backend_cpu_init"): (p, []), (cpu, "ggml_backend_cpu_set_n_threads"): (None, [p, ctypes.c_int]),
        (cpu, "ggml_backend_cpu_buffer_type"): (p, []),
    }
    fns = {}
    for (lib, name), (restype, argtypes) in signatures.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            fn = getattr(ggml, name)  # some builds export the backend API from libggml
        fn.restype, fn.argtypes = restype, argtypes
        fns[name] = fn
    return fns


def extra_buffer_types(g) -> list:
    """The CPU device's extra buffer types (the repack one on x86), as llama.cpp's loader asks for them."""
    device = g["ggml_backend_dev_by_type"](CPU_DEVICE)
    address = g["ggml_backend_reg_get_proc_address"](g["ggml_backend_dev_backend_reg"](device), b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return []
    array = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(device)
    found, i = [], 0
    while array[i]:
        found.append(array[i])
        i += 1
    return found


def weight_bytes(g, kind: str, k: int, n: int, rng) -> np.ndarray:
    values = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    if kind == "f32":
        return values
    out = np.empty(g["ggml_row_size"](TYPES[kind], k) * n, dtype=np.uint8)
    g["ggml_quantize_chunk"](TYPES[kind], values.ctypes.data, out.ctypes.data, 0, n, k, None)
    return out


def time_cell(g, backend, bufts: list, cell: dict, weights: int, repeats: int, rng) -> tuple[list, str]:
    """Milliseconds per mul_mat at each row count, and the buffer type the weights ended in."""
    k, n, kind = cell["k"], cell["n"], TYPES[cell["type"]]
    device = g["ggml_backend_dev_by_type"](CPU_DEVICE)
    data = [weight_bytes(g, cell["type"], k, n, rng) for _ in range(weights)]
    for buft in [*bufts, g["ggml_backend_cpu_buffer_type"]()]:
        wctx = g["ggml_init"](InitParams(g["ggml_tensor_overhead"]() * (weights + 1), None, True))
        tensors = [g["ggml_new_tensor_2d"](wctx, kind, k, n) for _ in range(weights)]
        buffer = g["ggml_backend_alloc_ctx_tensors_from_buft"](wctx, buft)
        probe_ctx = g["ggml_init"](InitParams(g["ggml_tensor_overhead"]() * 4, None, True))
        probe = g["ggml_mul_mat"](probe_ctx, tensors[0], g["ggml_new_tensor_2d"](probe_ctx, TYPES["f32"], k, 1))
        if buffer and g["ggml_backend_dev_supports_op"](device, probe):
            break
        g["ggml_free"](probe_ctx)
        g["ggml_free"](wctx)
    name = g["ggml_backend_buft_name"](buft).decode()
    for tensor, values in zip(tensors, data):
        g["ggml_backend_tensor_set"](tensor, values.ctypes.data, 0, values.nbytes)
    results = []
    for m in cell["rows"]:
        ctx = g["ggml_init"](InitParams(g["ggml_tensor_overhead"]() * (2 * weights + 2) + g["ggml_graph_overhead"](), None, True))
        a = g["ggml_new_tensor_2d"](ctx, TYPES["f32"], k, m)
        graph = g["ggml_new_graph"](ctx)
        for tensor in tensors:
            g["ggml_build_forward_expand"](graph, g["ggml_mul_mat"](ctx, tensor, a))
        g["ggml_backend_alloc_ctx_tensors_from_buft"](ctx, g["ggml_backend_cpu_buffer_type"]())
        rows = rng.standard_normal((m, k)).astype(np.float32)
        g["ggml_backend_tensor_set"](a, rows.ctypes.data, 0, rows.nbytes)
        g["ggml_backend_graph_compute"](backend, graph)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            g["ggml_backend_graph_compute"](backend, graph)
            best = min(best, time.perf_counter() - start)
        results.append(best / weights * 1e3)
        g["ggml_free"](ctx)
    g["ggml_backend_buffer_free"](buffer)
    g["ggml_free"](wctx)
    return results, name


def main() -> None:
    request = json.load(sys.stdin)
    g = load()
    backend = g["ggml_backend_cpu_init"]()
    g["ggml_backend_cpu_set_n_threads"](backend, request.get("threads", 2))
    bufts = extra_buffer_types(g)
    rng = np.random.default_rng(0)
    ms, buffers = [], []
    for cell in request["cells"]:
        times, name = time_cell(g, backend, bufts, cell, request.get("weights", 8), request.get("repeats", 5), rng)
        ms.append(times)
        buffers.append(name)
    json.dump({"ms": ms, "buffers": buffers}, sys.stdout)


if __name__ == "__main__":
    main()
