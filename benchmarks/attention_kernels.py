"""One layer's decode attention over the paged pool, four ways, on the same shapes.

usage: .venv/bin/python benchmarks/attention_kernels.py [--sequential] [--record] [--tiny]

32 sequences at contexts 150-192 (12 blocks of 16), GQA 8 query / 4 KV heads, head dim 64, a pool of
[4, 512 blocks, 16, 64] fp32; 2 threads:
- the portable kernel's ops as an ORT micro-graph: Gather of the blocks, QK of past and new keys,
  Where mask, Softmax, PV (ortinf/exporter/attention_portable.py traces to these);
- ONNX Attention-23 over the same gathered blocks (KV heads folded into the batch so each query
  group meets its one KV head);
- ortinf's own kernel library (ortinf/kernels/cpu/, the op the CPU graph runs): ortinf.PagedAttention, in
  place through the block table, on ORT's thread pool;
- an in-place kernel in numba (benchmark-only, .venv-bench-numba from
  benchmarks/peers/install_numba.sh): one parallel job per (sequence, KV head) reading K/V through
  the block table, only up to each sequence's own length.
All four are checked against each other. --sequential gives each sequence consecutive blocks
(random blocks otherwise). The micro-graph overstates the portable kernel's cost in the real graph
(see docs/performance.md); the comparison is between the three rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

KVH, G, S, NB, BLK, D, NBLK = 4, 2, 32, 512, 16, 64, 12
P = NBLK * BLK
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
REPEATS = 30


def median_ms(fn, repeats: int) -> float:
    import statistics
    import time

    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def inputs(sequential: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    blocks = np.arange(S * NBLK) if sequential else rng.permutation(NB)[: S * NBLK]
    return {
        "pool_k": rng.standard_normal((KVH, NB, BLK, D), np.float32),
        "pool_v": rng.standard_normal((KVH, NB, BLK, D), np.float32),
        "tables": blocks.reshape(S, NBLK).astype(np.int64),
        "q": rng.standard_normal((KVH, S, G, D), np.float32) * 0.125,
        "k": rng.standard_normal((KVH, S, 1, D), np.float32),
        "v": rng.standard_normal((KVH, S, 1, D), np.float32),
        "ctx": rng.integers(150, P + 1, S).astype(np.int64),
    }


def ort_rows(data: dict[str, np.ndarray]) -> tuple[dict[str, float], np.ndarray]:
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper as h

    F = T.FLOAT

    def vi(n, t, s):
        return h.make_tensor_value_info(n, t, s)

    common = [vi("pool_k", F, [KVH, NB, BLK, D]), vi("pool_v", F, [KVH, NB, BLK, D]), vi("tables", T.INT64, [S, NBLK]),
              vi("q", F, [KVH, S, G, D]), vi("k", F, [KVH, S, 1, D]), vi("v", F, [KVH, S, 1, D]), vi("mask", T.BOOL, [KVH, S, G, P + 1])]
    portable = h.make_graph([
        h.make_node("Gather", ["pool_k", "tables"], ["gk"], axis=1), h.make_node("Reshape", ["gk", "shape4"], ["pk"]),
        h.make_node("Gather", ["pool_v", "tables"], ["gv"], axis=1), h.make_node("Reshape", ["gv", "shape4"], ["pv"]),
        h.make_node("Transpose", ["pk"], ["pkt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["q", "pkt"], ["s_past"]),
        h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["q", "kt"], ["s_new"]),
        h.make_node("Concat", ["s_past", "s_new"], ["s"], axis=3),
        h.make_node("Where", ["mask", "s", "neg"], ["sm"]), h.make_node("Softmax", ["sm"], ["p"], axis=-1),
        h.make_node("Slice", ["p", "zero", "Pt", "three"], ["pp"]), h.make_node("Slice", ["p", "Pt", "big", "three"], ["pn"]),
        h.make_node("MatMul", ["pp", "pv"], ["o1"]), h.make_node("MatMul", ["pn", "v"], ["o2"]), h.make_node("Add", ["o1", "o2"], ["out"]),
    ], "portable", common, [vi("out", F, None)], [
        h.make_tensor("shape4", T.INT64, [4], [KVH, S, P, D]), h.make_tensor("neg", F, [], [-3.4e38]),
        h.make_tensor("zero", T.INT64, [1], [0]), h.make_tensor("Pt", T.INT64, [1], [P]), h.make_tensor("three", T.INT64, [1], [3]),
        h.make_tensor("big", T.INT64, [1], [1 << 30])])
    attention = h.make_graph([
        h.make_node("Gather", ["pool_k", "tables"], ["gk"], axis=1), h.make_node("Reshape", ["gk", "shape_b"], ["pk"]),
        h.make_node("Gather", ["pool_v", "tables"], ["gv"], axis=1), h.make_node("Reshape", ["gv", "shape_b"], ["pv"]),
        h.make_node("Reshape", ["q", "shape_q"], ["qb"]), h.make_node("Reshape", ["k", "shape_kv"], ["kb"]),
        h.make_node("Reshape", ["v", "shape_kv"], ["vb"]), h.make_node("Reshape", ["mask", "shape_m"], ["mb"]),
        h.make_node("Attention", ["qb", "kb", "vb", "mb", "pk", "pv"], ["out", "present_k", "present_v"], scale=1.0),
    ], "attention23", common, [vi("out", F, None)], [
        h.make_tensor("shape_b", T.INT64, [4], [KVH * S, 1, P, D]), h.make_tensor("shape_q", T.INT64, [4], [KVH * S, G, 1, D]),
        h.make_tensor("shape_kv", T.INT64, [4], [KVH * S, 1, 1, D]), h.make_tensor("shape_m", T.INT64, [4], [KVH * S, G, 1, P + 1])])
    mask = np.zeros((KVH, S, G, P + 1), bool)
    for s in range(S):
        mask[:, s, :, : data["ctx"][s]] = True
        mask[:, s, :, P] = True
    feeds = {k: v for k, v in data.items() if k != "ctx"} | {"mask": mask}
    rows, outs = {}, {}
    for name, graph in (("portable kernel's ops (ORT)", portable), ("ONNX Attention-23 (ORT)", attention)):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        session = ort.InferenceSession(h.make_model(graph, opset_imports=[h.make_opsetid("", 23)]).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        outs[name] = session.run(["out"], feeds)[0].reshape(KVH, S, G, D)
        rows[name] = median_ms(lambda: session.run(["out"], feeds), REPEATS)
    first, second = outs.values()
    assert np.abs(first - second).max() < 1e-4
    library_row(data, rows, first)
    return rows, first


def library_row(data: dict[str, np.ndarray], rows: dict[str, float], reference: np.ndarray) -> None:
    """ortinf.PagedAttention on the same data (query heads kv_head * G + g, as the graph orders them)."""
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper as h

    from ortinf.kernels import library

    name = "ortinf.PagedAttention (kernel library, in place)"
    if library.load() is None:
        rows[name] = float("nan")
        return
    names = ["query", "key", "value", "key_cache", "value_cache", "block_tables", "context_lens", "query_lens"]
    types = [T.FLOAT] * 5 + [T.INT64] * 3
    graph = h.make_graph([h.make_node("PagedAttention", names, ["out"], domain="ortinf", num_heads=KVH * G, kv_num_heads=KVH,
                                      scale=1.0)], "op", [h.make_tensor_value_info(n, t, None) for n, t in zip(names, types)],
                         [h.make_tensor_value_info("out", T.FLOAT, None)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    library.register(options)
    session = ort.InferenceSession(h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ortinf", 1)])
                                   .SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {"query": data["q"].transpose(1, 0, 2, 3).reshape(S, -1), "key": data["k"][:, :, 0].transpose(1, 0, 2).reshape(S, -1),
             "value": data["v"][:, :, 0].transpose(1, 0, 2).reshape(S, -1), "key_cache": data["pool_k"], "value_cache": data["pool_v"],
             "block_tables": data["tables"], "context_lens": data["ctx"], "query_lens": np.ones(S, np.int64)}
    out = session.run(None, feeds)[0].reshape(S, KVH, G, D).transpose(1, 0, 2, 3)
    assert np.abs(out - reference).max() < 1e-4, np.abs(out - reference).max()
    rows[name] = median_ms(lambda: session.run(None, feeds), REPEATS)


def numba_row(data: dict[str, np.ndarray]) -> tuple[float | None, np.ndarray | None, str]:
    python = ROOT / ".venv-bench-numba" / "bin" / "python"
    if not python.exists():
        return None, None, "not installed (bash benchmarks/peers/install_numba.sh)"
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "in.npz", **data)
        result = Path(tmp) / "out.json"
        subprocess.run([str(python), str(ROOT / "benchmarks" / "peers" / "paged_attention_numba.py"), str(Path(tmp) / "in.npz"),
                        str(result)], check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
        return json.loads(result.read_text())["ms"], np.load(str(result) + ".npy"), ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequential", action="store_true", help="consecutive blocks per sequence (random otherwise)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="3 repeats, no numba row (smoke test)")
    args = parser.parse_args()
    global REPEATS
    REPEATS = 3 if args.tiny else REPEATS
    from export_llama import report

    from ortinf.matrix import machine

    data = inputs(args.sequential)
    rows, reference = ort_rows(data)
    ms, out, why = numba_row(data) if not args.tiny else (None, None, "skipped (--tiny)")
    if out is not None:
        assert np.abs(out - reference).max() < 1e-4, np.abs(out - reference).max()
    lines = [f"### One layer's decode attention, 32 sequences at context 150-192, {'consecutive' if args.sequential else 'random'} blocks, 2 threads",
             "", f"Machine: {machine()}", "", "| kernel | ms per layer |", "|---|---:|"]
    lines += [f"| {name} | {value:.2f} |" for name, value in rows.items()]
    lines.append(f"| in place, numba (benchmark-only) | {f'{ms:.2f}' if ms is not None else why} |")
    report("\n".join(lines) + "\n", args.record)


if __name__ == "__main__":
    main()
