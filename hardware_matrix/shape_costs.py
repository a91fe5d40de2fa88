"""What a new input shape costs per provider, and what padding to shape buckets costs.

usage: .venv/bin/python hardware_matrix/shape_costs.py [--record]

A serving-like mix of 22 graph calls (decodes of 1-13 sequences at several contexts, prefills of
5-120 tokens) runs twice in a fresh process, on the 33.6M llama (fp32, 2 threads), with and without
shape buckets (ortinf/providers/base.py's powers of two). The first pass pays every compilation (Mesa's shader
disk cache is disabled, so WebGPU compiles as on a fresh machine); the second pass runs the same
calls warm. "extra" is a call's pass-1 time minus its pass-2 time: what compiling cost it (the
first call, then the mean over the 21 later calls, each a shape not seen before); padding cost =
pass 2 with buckets / pass 2 without. --record appends the table to hardware_matrix/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BLOCK_SIZE = 16


def workload(vocab: int):
    import numpy as np

    from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

    rng = np.random.default_rng(0)
    steps = []
    for num_seqs, context in [(1, 40), (2, 40), (3, 70), (5, 100), (8, 130), (13, 170), (1, 200), (4, 230)]:
        chunks = [SequenceChunk([int(rng.integers(3, vocab))], context, list(range(s * 16, s * 16 + context // BLOCK_SIZE + 1)))
                  for s in range(num_seqs)]
        steps.append(build_model_input(chunks, BLOCK_SIZE))
    for length in (7, 19, 33, 60, 100, 11, 45, 77, 23, 90, 5, 64, 37, 120):
        steps.append(build_model_input([SequenceChunk(rng.integers(3, vocab, length).tolist(), 0, list(range(8)))], BLOCK_SIZE))
    return steps


def worker(package: str, provider: str, buckets: bool) -> dict:
    from ortinf.providers.base import POWER_OF_TWO_BUCKETS
    from ortinf.runtime.worker.decoder_graph import DecoderGraph
    from ortinf.runtime.worker.model_input import pad_to_buckets

    graph = DecoderGraph(package, 256, BLOCK_SIZE, provider, intra_op_threads=2, shape_buckets=buckets)
    steps = workload(graph.spec.vocab_size)
    shapes = set()
    for step in steps:
        fed = pad_to_buckets(step, POWER_OF_TWO_BUCKETS, graph.pool.scratch_slot, BLOCK_SIZE) if buckets else step
        shapes.add(tuple((k, v.shape) for k, v in fed.feeds().items()))
    passes = []
    for _ in range(2):
        times = []
        for step in steps:
            start = time.perf_counter()
            graph.run(step)
            times.append(time.perf_counter() - start)
        passes.append(times)
    extra = [a - b for a, b in zip(*passes)]
    return {"pass1": sum(passes[0]), "pass2": sum(passes[1]), "shapes": len(shapes), "calls": len(steps),
            "first_extra": extra[0], "later_extra": sum(extra[1:]) / (len(extra) - 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="append the table to hardware_matrix/RESULTS.md")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        package, provider, buckets = args.worker
        print(json.dumps(worker(package, provider, buckets == "1")))
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import onnxruntime
    from export_llama import build
    from machine import describe, report

    import ortinf

    envs = [("cpu", Path(sys.executable)), ("webgpu", Path(sys.executable))]
    ov_python = ROOT / ".venv-openvino" / "bin" / "python"
    if ov_python.exists():
        envs.insert(1, ("openvino", ov_python))
    env = dict(os.environ, ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER="1", MESA_SHADER_CACHE_DISABLE="true")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp) / "hf")
        ortinf.export(Path(tmp) / "hf", Path(tmp) / "pkg", progress=False)
        for provider, python in envs:
            for buckets in (False, True):
                out = subprocess.run([str(python), __file__, "--worker", str(Path(tmp) / "pkg"), provider, "1" if buckets else "0"],
                                     capture_output=True, text=True, env=env, timeout=3600)
                if out.returncode != 0:
                    raise RuntimeError(out.stderr[-3000:])
                rows.append((provider, buckets, json.loads(out.stdout.strip().splitlines()[-1])))
                print(rows[-1], flush=True)
    lines = [
        f"## Shape compilation and bucket padding ({time.strftime('%Y-%m-%d')})",
        "",
        f"Machine: {describe()}; onnxruntime {onnxruntime.__version__}; "
        "33.6M llama fp32, 2 threads; 22 calls (8 decodes of 1-13 sequences, 14 prefills of 5-120 tokens), run twice in a "
        "fresh process; WebGPU on lavapipe with Mesa's shader cache disabled.",
        "",
        "| provider | buckets | distinct input shapes | pass 1 s (cold) | pass 2 s (warm) | first call, extra s | "
        "later calls, extra ms each | padding cost |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    warm = {(p, b): r["pass2"] for p, b, r in rows}
    for provider, buckets, r in rows:
        padding = f"{r['pass2'] / warm[(provider, False)]:.2f}x" if buckets else "-"
        lines.append(f"| {provider} | {'yes' if buckets else 'no'} | {r['shapes']} | {r['pass1']:.2f} | {r['pass2']:.2f} | "
                     f"{r['first_extra']:.2f} | {r['later_extra'] * 1e3:.0f} | {padding} |")
    report(lines, args.record)


if __name__ == "__main__":
    main()
