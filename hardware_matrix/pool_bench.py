"""Decode step and offline throughput per provider, with the KV pool at two sizes, in one run.

usage: .venv/bin/python hardware_matrix/pool_bench.py [--record] [--base-rev REV]

The model is the engine benchmark's 33.6M llama (random weights, fp32, 2 intra-op threads). Rows:

- "fed per call, numpy write": ortinf at --base-rev (the design before the bound pool: the pool fed
  to every call, the graph returning new K/V, numpy writing them), run from a checkout of that rev;
- "bound, graph write" / "bound, numpy write": this ortinf, the pool bound once, the step's K/V
  written by the graph's ScatterND (model.onnx) or by numpy (model.host-write.onnx); "(chosen)"
  marks the provider module's choice;
- "fed per call, graph write": this graph with the pool fed from host memory on every call, which is
  what a device provider paid before (ORT uploads every layer's pool per call).

Decode step: 16 sequences at context 128 decode one token, median ms; the pool holds 256 blocks or
8x that (2048). Offline: 16 prompts of 64+4i tokens, 32 greedy tokens each, output tokens/s (after
a warm-up run, so shader compilation is not counted). Each row runs in its own process.
--record appends the table to hardware_matrix/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BLOCK_SIZE = 16
POOLS = (256, 2048)
BATCH, CONTEXT = 16, 128


def decode_input(vocab: int):
    import numpy as np

    from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

    rng = np.random.default_rng(0)
    per_seq = CONTEXT // BLOCK_SIZE + 1
    chunks = [SequenceChunk([int(rng.integers(3, vocab))], CONTEXT, list(range(s * per_seq, (s + 1) * per_seq))) for s in range(BATCH)]
    return build_model_input(chunks, BLOCK_SIZE)


def worker(package: str, provider: str, mode: str) -> dict:
    """Runs in the measured environment (this checkout, the base checkout or .venv-openvino).

    mode: "default" (the provider's own choice; the only one the base revision knows), "graph" or
    "host" (that KV write forced), "fed" (the graph-write graph with the pool fed per call)."""
    import numpy as np

    from ortinf.config import EngineConfig
    from ortinf.runtime.engine.llm_engine import LLMEngine
    from ortinf.runtime.sample.sampling_params import SamplingParams
    from ortinf.runtime.worker.decoder_graph import DecoderGraph

    fed, name = mode == "fed", provider
    if mode in ("graph", "host", "fed"):
        import dataclasses

        from ortinf.providers.registry import Found, resolve

        found = resolve(provider)
        provider = Found(dataclasses.replace(found.provider, kv_write="host" if mode == "host" else "graph"), found.devices)
    result: dict = {"decode_ms": {}}
    for num_blocks in POOLS:
        graph = DecoderGraph(package, num_blocks, BLOCK_SIZE, provider, intra_op_threads=2)
        model_input = decode_input(graph.spec.vocab_size)
        if fed:
            from ortinf.manifest import LOGITS

            pools = dict(zip(graph.pool.input_names, [np.zeros(graph.pool.shape, np.float32) for _ in graph.pool.input_names]))
            feeds = {**model_input.feeds(), **pools}
            call = lambda: graph.session.run([LOGITS], feeds)  # noqa: E731
        else:
            call = lambda: graph.run(model_input)  # noqa: E731
        for _ in range(3):
            call()
        times = []
        for _ in range(7 if fed else 25):
            start = time.perf_counter()
            call()
            times.append((time.perf_counter() - start) * 1e3)
        result["decode_ms"][num_blocks] = statistics.median(times)
    if fed:
        return result
    prompts = [[int(t) for t in np.random.default_rng(i).integers(3, 8000, 64 + 4 * i)] for i in range(16)]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    engine = LLMEngine(EngineConfig(package_dir=Path(package), provider=name, num_blocks=POOLS[0], block_size=BLOCK_SIZE,
                                    max_num_seqs=16, intra_op_threads=2, enable_prefix_caching=False))
    if not isinstance(provider, str):  # the engine resolves names itself; a forced write path goes in directly
        engine.graph = graph = DecoderGraph(package, POOLS[0], BLOCK_SIZE, provider, intra_op_threads=2)
        engine.runner.graph = graph
    for run in ("warm-up", "measured"):
        for prompt in prompts:
            engine.add_request(prompt, params)
        start, tokens = time.perf_counter(), 0
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    tokens += len(output.outputs[0].token_ids)
        result["tok_s"] = tokens / (time.perf_counter() - start)
    return result


def base_checkout(rev: str, work: Path) -> Path:
    """A folder importable as `ortinf` at REV: the checkout itself since issue 30 (every package under
    ortinf/), else a shim for the older trees, whose pyproject mapped top-level folders into ortinf.*."""
    tree = work / "base-tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True, capture_output=True)
    if not (tree / "runtime").is_dir():
        return tree
    shim = work / "base-shim"
    shutil.copytree(tree / "ortinf", shim / "ortinf")
    for name in ("runtime", "exporter", "providers", "kernels", "serve"):
        (shim / "ortinf" / name).symlink_to(tree / name)
    return shim


def run_row(python: Path, package: Path, provider: str, mode: str = "default", pythonpath: Path | None = None) -> dict:
    env = dict(os.environ, ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run([str(python), __file__, "--worker", str(package), provider, mode],
                         capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{provider} row failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="append the table to hardware_matrix/RESULTS.md")
    parser.add_argument("--base-rev", default="9187699", help="the ortinf revision with the host pool (default: the last one)")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        package, provider, mode = args.worker
        print(json.dumps(worker(package, provider, mode)))
        return

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import onnxruntime
    from export_llama import build
    from machine import describe, report

    here = Path(sys.executable)
    ov_python = ROOT / ".venv-openvino" / "bin" / "python"
    work = Path(tempfile.mkdtemp(prefix="pool-bench-"))
    try:
        build(work / "hf")
        import ortinf

        ortinf.export(work / "hf", work / "pkg", progress=False)
        shim = base_checkout(args.base_rev, work)
        subprocess.run([str(here), "-c", f"import ortinf; ortinf.export({str(work / 'hf')!r}, {str(work / 'pkg-base')!r}, progress=False)"],
                       check=True, env=dict(os.environ, PYTHONPATH=str(shim)), capture_output=True, cwd=work)  # not this checkout's ortinf/
        base = f"fed per call, numpy write ({args.base_rev})"
        rows = [
            ("cpu", base, run_row(here, work / "pkg-base", "cpu", pythonpath=shim)),
            ("cpu", "bound, graph write (chosen)", run_row(here, work / "pkg", "cpu", "graph")),
            ("cpu", "bound, numpy write", run_row(here, work / "pkg", "cpu", "host")),
        ]
        if ov_python.exists():
            rows.append(("openvino (CPU)", base, run_row(ov_python, work / "pkg-base", "openvino", pythonpath=shim)))
            rows.append(("openvino (CPU)", "bound, numpy write (chosen)", run_row(ov_python, work / "pkg", "openvino", "host")))
            rows.append(("openvino (CPU)", "bound, graph write", run_row(ov_python, work / "pkg", "openvino", "graph")))
        rows.append(("webgpu (lavapipe)", "bound, graph write (chosen)", run_row(here, work / "pkg", "webgpu", "graph")))
        rows.append(("webgpu (lavapipe)", "fed per call, graph write", run_row(here, work / "pkg", "webgpu", "fed")))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "base-tree")], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    lines = [
        f"## KV pool placement per provider ({time.strftime('%Y-%m-%d')})",
        "",
        f"Machine: {describe()}; onnxruntime "
        f"{onnxruntime.__version__}; 33.6M llama fp32, 2 threads. Decode step: {BATCH} sequences at context {CONTEXT}, "
        f"median ms, pool of {POOLS[0]} vs {POOLS[1]} blocks of {BLOCK_SIZE}. Offline: 16 prompts of 64+4i tokens, "
        "32 greedy tokens each, output tok/s after a warm-up run.",
        "",
        f"| provider | pool, KV write | step ms, {POOLS[0]} blocks | step ms, {POOLS[1]} blocks | growth | offline tok/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for provider, pool, r in rows:
        small, large = r["decode_ms"][str(POOLS[0])], r["decode_ms"][str(POOLS[1])]
        tok_s = f"{r['tok_s']:.0f}" if "tok_s" in r else "-"
        lines.append(f"| {provider} | {pool} | {small:.1f} | {large:.1f} | {large / small:.2f}x | {tok_s} |")
    for name in ("cuda (onnxruntime-gpu)", "migraphx", "dml"):
        lines.append(f"| {name} | bound, graph write | not measured | not measured | - | not measured |")
    report(lines, args.record)


if __name__ == "__main__":
    main()
