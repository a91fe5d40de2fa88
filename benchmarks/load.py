"""Load time and memory at the sizes people run: ortinf's packages beside llama.cpp's GGUFs, in one run.

usage: .venv/bin/python benchmarks/load.py --ortinf PKG [PKG ...] [--gguf FILE ...] [--repeats 3] [--record] [--tiny]

Each load is a fresh process on a warm page cache (one load of each first, untimed), the engines interleaved, the
best and worst of --repeats shown. "load s" is opening the model until it can generate, after the imports: ortinf's
LLM() with a 256 MiB KV pool, llama.cpp's Llama() (llama-cpp-python, .venv-bench-llamacpp) with a 4,096-token
context. Rows:
- "ortinf, packed store": the package's CPU kernels map their packed weights from model.onnx.data.<isa>.packed
  (ortinf/kernels/cpu/packed_store.h);
- "ortinf, packing at load": the same package with ORTINF_PACKED_STORE=0, the load as it was before the store;
- "llama.cpp": the GGUF, mapped.
"RSS after load" is the process's resident memory once the model is ready, over the weights' bytes (the package's
*.onnx.data, or the GGUF) + the KV pool; "imports s" the time before the load starts (Python, ORT, ortinf / llama_cpp).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from export_memory import cpu_flags
from record import finish

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CPP_PYTHON = ROOT / ".venv-bench-llamacpp" / "bin" / "python"
POOL = 256 << 20

PROBE_ORTINF = """
import json, sys, time
start = time.perf_counter()
from ortinf.llm import LLM
imported = time.perf_counter()
llm = LLM(sys.argv[1], provider="cpu", kv_cache_memory=int(sys.argv[2]))
loaded = time.perf_counter()
rss = int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
print(json.dumps({"imports": imported - start, "load": loaded - imported, "rss": rss}))
"""

PROBE_LLAMA_CPP = """
import json, sys, time
start = time.perf_counter()
import llama_cpp
imported = time.perf_counter()
llm = llama_cpp.Llama(sys.argv[1], n_ctx=4096, n_threads=2, verbose=False)
loaded = time.perf_counter()
rss = int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
print(json.dumps({"imports": imported - start, "load": loaded - imported, "rss": rss}))
"""


def probe(engine: str, path: Path) -> dict:
    env = dict(os.environ)
    if engine == "ortinf, packing at load":
        env["ORTINF_PACKED_STORE"] = "0"
    python, script, args = ((str(LLAMA_CPP_PYTHON), PROBE_LLAMA_CPP, [str(path)]) if engine == "llama.cpp"
                            else (sys.executable, PROBE_ORTINF, [str(path), str(POOL)]))
    out = subprocess.run([python, "-c", script, *args], capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{engine} {path}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def weight_bytes(engine: str, path: Path) -> int:
    if engine == "llama.cpp":
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.glob("*.onnx.data"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ortinf", nargs="*", type=Path, default=[], help="ortinf package folders")
    parser.add_argument("--gguf", nargs="*", type=Path, default=[], help="GGUF files for llama.cpp (same models)")
    parser.add_argument("--repeats", type=int, default=3, help="timed loads per row")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="the smoke test: one load of the bundled demo, no llama.cpp")
    args = parser.parse_args()
    if args.tiny:
        from ortinf.bundled import resolve_package

        args.ortinf, args.gguf, args.repeats = [resolve_package(progress=False)], [], 1
    rows = [(engine, path) for path in args.ortinf for engine in ("ortinf, packed store", "ortinf, packing at load")]
    if args.gguf and not LLAMA_CPP_PYTHON.exists():
        raise SystemExit(f"{LLAMA_CPP_PYTHON} is missing: run benchmarks/peers/install_llama_cpp.sh")
    rows += [("llama.cpp", path) for path in args.gguf]
    for engine, path in rows:  # warm the page cache, and write the packed store where it is missing
        if engine != "ortinf, packing at load":
            probe(engine, path)
    figures: dict = {row: [] for row in rows}
    for _ in range(args.repeats):
        for row in rows:
            figures[row].append(probe(*row))
    lines = ["### Load: ortinf's packed store beside packing at load" + (" and llama.cpp" if args.gguf else ""), "",
             f"Machine: CPU flags {cpu_flags()}, {os.cpu_count()} cores; {args.repeats} loads per row, interleaved.", "",
             "| engine | model | load s (best-worst) | imports s | RSS after load GB | RSS / (weights + KV pool) |",
             "|---|---|---:|---:|---:|---:|"]
    for (engine, path), runs in figures.items():
        loads = sorted(r["load"] for r in runs)
        rss = min(r["rss"] for r in runs)
        kv = 0 if engine == "llama.cpp" else POOL  # llama.cpp: its context is inside its RSS
        lines.append(f"| {engine} | {path.name} | {loads[0]:.2f}-{loads[-1]:.2f} | {min(r['imports'] for r in runs):.2f} | "
                     f"{rss / 1e9:.2f} | {rss / (weight_bytes(engine, path) + kv):.2f} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
