"""A GGUF file through ortinf beside llama.cpp on the same file: greedy tokens and the time from file to package.

usage: .venv/bin/python benchmarks/gguf_parity.py [--size toy|0.5b] [--demo] [--tiny] [--record]

The benchmark llama (benchmarks/compare.py's shapes, random weights) is written to GGUF and quantized to
Q8_0 and Q4_0 by llama.cpp itself (benchmarks/peers/run_llama_cpp.py, in .venv-bench-llamacpp, installed by
benchmarks/peers/install_llama_cpp.sh), which also decodes the prompts greedily (batch mode, f32 KV). ortinf
exports each file with its defaults (`ortinf export model.gguf`: Q8_0 -> int8, Q4_0 -> int4, blocks of 32
holding the file's values; ortinf/exporter/gguf_source.py) and decodes the same prompts on its CPU kernel
graph (activations quantized per token and block, as ggml's Q8 dot products do) and on its portable graph at
accuracy level 0 (fp32 activations). transformers reading the same GGUF (its weights dequantized, fp32) is the
third column. Reported per file: prompts whose tokens equal the other engine's, and the mean position of
the first difference (the token count when equal); the export's wall time. Random weights give flat
next-token distributions, where any two kernels' roundings flip argmaxes (llama.cpp and transformers differ
on them too); --demo runs the bundled trained llama (ortinf/assets/demo-llama) on the opening lines of
standard-library modules instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from compare import SIZES, Engine, build_model, run  # noqa: E402
from record import finish  # noqa: E402

from ortinf.matrix import machine  # noqa: E402

PRECISIONS = {"q8_0": "Q8_0", "q4_0": "Q4_0"}


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def agreement(a: list[list[int]], b: list[list[int]]) -> str:
    equal = sum(x == y for x, y in zip(a, b))
    return f"{equal}/{len(a)} (first difference at {statistics.mean(first_difference(x, y) for x, y in zip(a, b)):.1f})"


def ortinf_tokens(package: Path, prompt_set: list[list[int]], new_tokens: int, **options) -> list[list[int]]:
    from ortinf import LLM, SamplingParams

    llm = LLM(package, provider="cpu", intra_op_threads=2, enable_prefix_caching=False, **options)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_set, params)]


def transformers_tokens(gguf: Path, prompt_set: list[list[int]], new_tokens: int) -> list[list[int]]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt in prompt_set:
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=0)
            out.append(ids[0, len(prompt):].tolist())
    return out


def demo_prompts(hf_dir: Path, count: int) -> list[list[int]]:
    """The bundled demo llama copied to hf_dir, and the first 48 tokens of `count` standard-library modules."""
    import shutil
    import sysconfig

    from tokenizers import Tokenizer

    if not hf_dir.exists():
        shutil.copytree(ROOT / "ortinf" / "assets" / "demo-llama", hf_dir)
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = ["textwrap.py", "shlex.py", "glob.py", "fnmatch.py", "bisect.py", "heapq.py", "colorsys.py", "keyword.py"]
    return [tokenizer.encode((stdlib / name).read_text()).ids[:48] for name in files[:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["toy", "0.5b"], default="toy", help="the benchmark llama's shape (benchmarks/compare.py)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model, 4 prompts, 8 tokens (the smoke test)")
    parser.add_argument("--demo", action="store_true", help="the bundled trained llama on Python source, not random weights")
    parser.add_argument("--work", type=Path, default=None, help="folder for the models (default: a temporary one)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    import numpy as np

    size = SIZES[args.size]
    count, new_tokens = (4, 8) if args.tiny else (8, 32)
    work = args.work or Path(tempfile.mkdtemp(prefix="ortinf-gguf-parity-"))
    hf_dir = work / "hf"
    if args.demo:
        prompt_set = demo_prompts(hf_dir, count)
    else:
        build_model(hf_dir, tiny=args.tiny, size=args.size)
        vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
        rng = np.random.default_rng(0)
        prompt_set = [rng.integers(3, vocab, 32 + 8 * i).tolist() for i in range(count)]
    import ortinf

    model = "the bundled demo llama (trained)" if args.demo else f"{'tiny' if args.tiny else size.label}, random weights"
    lines = [f"### GGUF files: ortinf beside llama.cpp on the same file ({model}, "
             f"{count} prompts x {new_tokens} greedy tokens)", "", f"Machine: {machine()}", "",
             "| file | ortinf package | export s | ortinf CPU kernel = llama.cpp | ortinf fp32 activations = llama.cpp | "
             "ortinf CPU kernel = transformers | llama.cpp = transformers |", "|---|---|---|---|---|---|---|"]
    for precision, label in PRECISIONS.items():
        engine = Engine("llama.cpp", "llama_cpp", ".venv-bench-llamacpp", precision, precision, (("kv", "f32"),))
        row = run(engine, "batch", work, hf_dir, prompt_set, timeout=3600, new_tokens=new_tokens)
        if row.result is None:
            lines.append(f"| {label} | llama.cpp {row.error} | | | | | |")
            continue
        gguf = work / "llama_cpp" / f"model-{precision}.gguf"
        start = time.monotonic()
        manifest = ortinf.export(gguf, work / f"ortinf-{precision}", overwrite=True, progress=False, quality_gate="record",
                                 accuracy_level=0)
        seconds = time.monotonic() - start
        kernel = ortinf_tokens(work / f"ortinf-{precision}", prompt_set, new_tokens)
        portable = ortinf_tokens(work / f"ortinf-{precision}", prompt_set, new_tokens, cpu_kernel=False)
        reference = transformers_tokens(gguf, prompt_set, new_tokens)
        theirs = row.result["tokens"]
        lines.append(f"| {label} | {manifest.dtype}, blocks of {manifest.quantization.block_size if manifest.quantization else '-'} | "
                     f"{seconds:.1f} | {agreement(kernel, theirs)} | {agreement(portable, theirs)} | {agreement(kernel, reference)} | "
                     f"{agreement(theirs, reference)} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
