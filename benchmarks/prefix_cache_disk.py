"""Issue 45's benchmark: a long system prompt's time to first token cold, from the in-memory prefix cache, and after a
restart from --prefix-cache-dir (ortinf/runtime/worker/prefix_store.py), beside llama.cpp's state restore (what
llama-server's --slot-save-path does: llama_state_get_data written to disk, read into a fresh context); and the
time from a request to its first token when --models-dir must swap models under --max-loaded-models 1, beside
loading the GGUF in llama.cpp (what Ollama does on a request for a model it has not loaded).

    .venv/bin/python benchmarks/prefix_cache_disk.py --package PKG [--gguf model.gguf] [--prompt-tokens 4000]
    .venv/bin/python benchmarks/prefix_cache_disk.py --tiny      # the test suite's smoke run

"restart" is a new engine (a new llama.cpp context) in the same process over the same files, with the page cache
warm for both (a restarted server on the same box); each figure is the median of --rounds. Prints a table.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def ttft(engine, prompt: list[int]) -> float:  # an LLMEngine
    """Seconds from adding a greedy one-token request to its output."""
    from ortinf.runtime.sample.sampling_params import SamplingParams

    start = time.perf_counter()
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def ortinf_rows(package: Path, prompt: list[int], rounds: int, threads: int) -> dict[str, float]:
    from ortinf.config import EngineConfig
    from ortinf.runtime.engine.llm_engine import LLMEngine

    def engine(folder: str | None) -> LLMEngine:
        return LLMEngine(EngineConfig(package_dir=package, provider="cpu", intra_op_threads=threads, kv_cache_memory="1GiB",
                                      max_num_batched_tokens=512, prefix_cache_dir=folder))

    cold, hit, restart, restored = [], [], [], 0
    for _ in range(rounds):
        folder = tempfile.mkdtemp(prefix="ortinf-kv-")
        try:
            first = engine(folder)
            cold.append(ttft(first, prompt))
            hit.append(ttft(first, prompt))
            first.close()
            second = engine(folder)
            restart.append(ttft(second, prompt))
            restored = second.kv_cache.store.num_restored
            second.close()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return {"cold": statistics.median(cold), "hit": statistics.median(hit), "restart": statistics.median(restart),
            "restored_blocks": restored}


def llama_rows(gguf: Path, prompt: list[int], rounds: int, threads: int) -> dict[str, float]:
    """llama.cpp (llama-cpp-python): a cold prefill, the prompt again (its prefix reuse), and a fresh context that
    reads the saved state from disk (llama-server's slot restore)."""
    code = r'''
import pickle, statistics, sys, time, json
from llama_cpp import Llama
gguf, threads, rounds, state_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
prompt = json.loads(sys.stdin.read())
def new():
    return Llama(model_path=gguf, n_ctx=len(prompt) + 512, n_batch=512, n_threads=threads, verbose=False, logits_all=False)
def first(llm):
    start = time.perf_counter()
    next(iter(llm.generate(prompt, temp=0.0, reset=True)))
    return time.perf_counter() - start
cold, hit, restart, load = [], [], [], []
for _ in range(rounds):
    start = time.perf_counter(); llm = new(); load.append(time.perf_counter() - start)
    cold.append(first(llm))
    hit.append(first(llm))
    with open(state_file, "wb") as out:
        pickle.dump(llm.save_state(), out)
    del llm
    fresh = new()
    start = time.perf_counter()
    with open(state_file, "rb") as src:
        fresh.load_state(pickle.load(src))
    restart.append(time.perf_counter() - start + first(fresh))
    del fresh
print(json.dumps({"cold": statistics.median(cold), "hit": statistics.median(hit), "restart": statistics.median(restart),
                  "load": statistics.median(load)}))
'''
    python = ROOT / ".venv-bench-llamacpp" / "bin" / "python"
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([str(python), "-c", code, str(gguf), str(threads), str(rounds), f"{folder}/state.bin"],
                              input=json.dumps(prompt), capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp run failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def swap_rows(package: Path, rounds: int) -> dict[str, float]:
    """A server with --models-dir holding the package twice (a, b) under --max-loaded-models 1: seconds from a request
    for the model not loaded to its first streamed token (the other unloads, it loads)."""
    import httpx

    sys.path.insert(0, str(ROOT / "tests"))
    from support.server_helpers import running_server

    times = []
    with tempfile.TemporaryDirectory() as folder:
        for name in ("a", "b"):
            os.symlink(package, Path(folder) / name)
        args = ["--models-dir", folder, "--max-loaded-models", "1", "--kv-cache-memory", "512MiB"]
        with running_server(args, Path(folder)) as server:
            def first_token(model: str) -> float:
                start = time.perf_counter()
                with httpx.stream("POST", f"{server.url}/v1/completions", timeout=600,
                                  json={"model": model, "prompt": [5, 6, 7, 8], "max_tokens": 2, "stream": True}) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: {"):
                            return time.perf_counter() - start
                raise RuntimeError("no token")

            first_token("a")
            for index in range(rounds * 2):
                times.append(first_token("b" if index % 2 == 0 else "a"))
    return {"swap": statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, help="a text-generation package (the 0.5B shape's)")
    parser.add_argument("--gguf", type=Path, help="the same model as a GGUF for llama.cpp")
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--tiny", action="store_true", help="a tiny random model, short prompt: checks the script runs")
    args = parser.parse_args()
    if args.tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        from support.tiny_models import add_tokenizer, build_decoder

        import ortinf

        root = Path(tempfile.mkdtemp(prefix="ortinf-bench-"))
        build_decoder("llama", root / "hf")
        add_tokenizer(root / "hf")
        ortinf.export(root / "hf", root / "pkg", progress=False)
        args.package, args.prompt_tokens, args.rounds = root / "pkg", 200, 1
    if args.package is None:
        parser.error("pass --package PKG (or --tiny)")
    prompt = [3 + (i * 7919) % 250 for i in range(args.prompt_tokens)]
    rows = {"ortinf": ortinf_rows(args.package, prompt, args.rounds, args.threads)}
    rows["ortinf"].update(swap_rows(args.package, args.rounds))
    if args.gguf is not None:
        rows["llama.cpp"] = llama_rows(args.gguf, prompt, args.rounds, args.threads)
    print(f"### Long-prompt TTFT across a restart, and model swap (prompt {args.prompt_tokens} tokens, {args.threads} threads, "
          f"median of {args.rounds})")
    print("| engine | cold TTFT s | in-memory hit s | after restart s | restart / hit | swap or load s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        swap = row.get("swap", row.get("load"))
        print(f"| {name} | {row['cold']:.3f} | {row['hit']:.3f} | {row['restart']:.3f} | {row['restart'] / row['hit']:.2f} | "
              f"{swap:.3f} |")
    if args.tiny:
        assert rows["ortinf"]["restored_blocks"] > 0, rows
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
