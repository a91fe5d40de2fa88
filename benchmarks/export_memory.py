"""Export memory and time at the sizes people run: the streaming exporter beside the in-memory one.

usage: .venv/bin/python benchmarks/export_memory.py [--size 1.5b|3b|7b] [--dtypes int4 int8 bf16 ...] [--in-memory]
                                                    [--serve] [--record] [--tiny]

The source is written once under /tmp/ortinf-bench/<size>-bf16 (never in the repository) as real
checkpoints are: bf16 safetensors in shards of at most 4 GiB with an index, random weights (std 0.02), and
a word-level placeholder tokenizer. Shapes: 1.5b is Qwen2.5-1.5B (hidden 1536, 28 layers, 12 heads / 2 KV,
intermediate 8960, vocab 151936, tied embeddings), 3b Llama-3.2-3B (3072, 28, 24 / 8, 8192, 128256, tied),
7b Qwen2.5-7B (3584, 28, 28 / 4, 18944, 152064).

Each export is `ortinf export SRC -o OUT --dtype D --quality-gate record` in its own process (a random
model's flat distributions miss any quality gate); its peak RSS is the process's ru_maxrss (wait4), its
time the wall clock, with the stages' share from the export's log. `--in-memory` adds the in-memory path's
row (ortinf.export(..., in_memory=True): the whole model loaded and traced) in the same run, where it fits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from record import finish

SOURCES = Path("/tmp/ortinf-bench")
SHARD_BYTES = 4 << 30
SHAPES = {
    "tiny": ("qwen2", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                           vocab_size=512, tie_word_embeddings=True)),
    "1.5b": ("qwen2", dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                           intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True)),
    "3b": ("llama", dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                         intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True)),
    "7b": ("qwen2", dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                         intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)),
}


def build_source(folder: Path, size: str, model_type: str | None = None) -> int:
    """Writes the bf16 checkpoint (shard by shard: one shard in memory at a time); returns its bytes. `model_type`
    replaces the shape's architecture (compare.py writes llama-architecture models of these shapes: every peer's
    converter takes llama)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    if (folder / "config.json").is_file():
        return sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    natural, shape = SHAPES[size]
    model_type = model_type or natural
    config_class = transformers.Qwen2Config if model_type == "qwen2" else transformers.LlamaConfig
    config = config_class(**shape, max_position_embeddings=4096, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    names = {name: list(p.shape) for name, p in skeleton.state_dict().items()}
    if config.tie_word_embeddings:
        names.pop("lm_head.weight", None)
    generator = torch.Generator().manual_seed(0)
    shards: list[list[str]] = [[]]  # tensor names per shard, each under SHARD_BYTES
    filled, total = 0, 0
    for name, dims in names.items():
        nbytes = 2 * int(torch.Size(dims).numel())
        if filled + nbytes > SHARD_BYTES and shards[-1]:
            shards.append([])
            filled = 0
        shards[-1].append(name)
        filled += nbytes
        total += nbytes
    weight_map = {}
    for index, shard in enumerate(shards):  # one shard's tensors in memory at a time
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: torch.ones(names[name], dtype=torch.bfloat16) if name.endswith("norm.weight")
                   else (torch.randn(names[name], generator=generator) * 0.02).to(torch.bfloat16) for name in shard}
        save_file(tensors, str(partial / file), metadata={"format": "pt"})
        del tensors
        weight_map.update({name: file for name in shard})
    (partial / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    config.architectures = [type(skeleton).__name__]  # converters (onnxruntime-genai's builder) dispatch on it
    config.save_pretrained(partial)
    _tokenizer(partial, config.vocab_size)
    partial.rename(folder)
    return total


def _tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>").save_pretrained(folder)


def measure(command: list[str], log: Path) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in GiB, outcome) of one export process (its ru_maxrss, from wait4). The outcome
    is "ok", or how it ended: the in-memory path is killed by the kernel's OOM killer where it does not fit."""
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.WIFSIGNALED(status):
        outcome = "killed (out of memory)" if os.WTERMSIG(status) == 9 else f"killed by signal {os.WTERMSIG(status)}"
    elif os.WEXITSTATUS(status) != 0:
        outcome = f"failed (exit {os.WEXITSTATUS(status)}: see {log})"
    else:
        outcome = "ok"
    return wall, usage.ru_maxrss / 2**20, outcome


def quality(package: Path) -> str:
    """The export's own figures from its manifest (parity; top-1 / KL for int8 and int4)."""
    manifest = json.loads((package / "ortinf.json").read_text())
    figures = f"parity {manifest['parity']['max_abs_diff']:.3g}"
    if manifest.get("quality"):
        figures += f", top-1 {manifest['quality']['top1_agreement']:.3f}, KL {manifest['quality']['mean_kl']:.4f}"
    return figures


def tree_rss(pid: int) -> int:
    """RSS bytes of a process and its descendants (from /proc)."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]) * 1024
            pending += [int(c) for t in Path(f"/proc/{current}/task").iterdir() for c in (t / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total


SERVE_KV = "512MiB"  # the served package's KV pool (the default, 20% of free RAM, would dominate the RSS figure)


def serve_figures(package: Path) -> tuple[float, float, float]:
    """`ortinf serve` of the package with a SERVE_KV pool: (seconds until /health answers 200, RSS GiB then, RSS GiB
    after one 16-token completion), the server started here on 127.0.0.1 and stopped after."""
    import urllib.request

    from serve import free_port

    port = free_port()
    ortinf = str(Path(sys.executable).with_name("ortinf"))
    start = time.perf_counter()
    server = subprocess.Popen([ortinf, "serve", str(package), "--host", "127.0.0.1", "--port", str(port), "--kv-cache-memory", SERVE_KV],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"ortinf serve {package} exited with {server.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.2)
        ready = time.perf_counter() - start
        at_ready = tree_rss(server.pid)
        body = json.dumps({"model": package.name, "prompt": "Hello", "max_tokens": 16, "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=600).read()
        return ready, at_ready / 2**30, tree_rss(server.pid) / 2**30
    finally:
        server.terminate()
        server.wait(timeout=60)


def package_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.suffix != ".packed")  # the store is a cache


def cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return platform.processor()
    return " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=[s for s in SHAPES if s != "tiny"], default="1.5b", help="the source's shape")
    parser.add_argument("--dtypes", nargs="+", default=["int4", "int8"], help="export precisions (int4 int8 bf16 fp32 fp16)")
    parser.add_argument("--in-memory", action="store_true", help="also the in-memory path (the whole model loaded), same run")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (the smoke test)")
    parser.add_argument("--serve", action="store_true", help="also serve each streamed package: /health time and RSS")
    args = parser.parse_args()
    size = "tiny" if args.tiny else args.size
    source = SOURCES / f"{size}-bf16"
    started = time.perf_counter()
    source_bytes = build_source(source, size)
    print(f"source: {source} ({source_bytes / 2**30:.2f} GiB bf16; built or found in {time.perf_counter() - started:.0f} s)", flush=True)
    ortinf = str(Path(sys.executable).with_name("ortinf"))
    rows = []
    for dtype in args.dtypes:
        paths = [("streaming", [ortinf, "export", str(source), "-o"])]
        if args.in_memory:
            paths.append(("in memory", [sys.executable, "-c", "import sys, ortinf; ortinf.export(sys.argv[1], sys.argv[2], dtype=sys.argv[3], "
                                        "overwrite=True, quality_gate='record', progress=False, in_memory=True)", str(source)]))
        for label, command in paths:
            out = SOURCES / f"{size}-{dtype}-{label.replace(' ', '-')}"
            full = [*command, str(out), "--dtype", dtype, "--overwrite", "--quality-gate", "record"] if label == "streaming" \
                else [*command, str(out), dtype]
            wall, peak, outcome = measure(full, SOURCES / f"{out.name}.log")
            serving = "-"
            if outcome == "ok" and label == "streaming":
                outcome = f"ok: {quality(out)}"
                if args.serve:
                    ready, at_ready, after = serve_figures(out)
                    serving = f"{ready:.1f} s, {at_ready:.2f} / {after:.2f} GiB"
            rows.append((label, dtype, wall, peak, package_bytes(out) / 2**30 if out.exists() else 0.0, serving, outcome))
            print(f"  {label:<10} {dtype:<5} {wall:7.1f} s  peak RSS {peak:6.2f} GiB  package {rows[-1][4]:.2f} GiB  serve {serving}  "
                  f"{outcome}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    model_type, shape = SHAPES[size]
    lines = [f"### Export memory, {size} ({model_type}: hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers, vocab "
             f"{shape['vocab_size']}; bf16 source {source_bytes / 2**30:.2f} GiB) ({time.strftime('%Y-%m-%d')}, {platform.machine()}, "
             f"{os.cpu_count()} cores, {cpu_flags()})", "",
             f"| path | dtype | wall s | peak RSS GiB | package GiB | serve (KV pool {SERVE_KV}): /health after, RSS ready / after a "
             "request | outcome |",
             "|---|---|---:|---:|---:|---|---|"]
    lines += [f"| ortinf {label} | {dtype} | {wall:.1f} | {peak:.2f} | {package:.2f} | {serving} | {outcome} |"
              for label, dtype, wall, peak, package, serving, outcome in rows]
    finish(lines, args.record)


if __name__ == "__main__":
    main()
