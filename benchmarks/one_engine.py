"""Before and after issue 30 (one engine), in the same run: the same packages through the runtime of a
base revision (the encoder-decoder loop of its own) and of this tree (encoder-decoders as ordinary
requests of the text engine).

usage: .venv/bin/python benchmarks/one_engine.py [--base REV] [--rounds N] [--record] [--tiny]

Rows, each the median of the rounds, base and current alternating in fresh processes (2 threads each):
- Whisper (whisper-tiny shape, random weights, EOS suppressed so that every window decodes `TOKENS`
  tokens): 4 audios of 30 s side by side, and one of 150 s (5 windows side by side); real-time factor.
- BART (d_model 256, 3 + 3 layers, vocabulary 8,000, random weights): 32 sources of 24 tokens, 32
  tokens out each (greedy); seconds.
- A text decoder (benchmarks/export_llama.py's llama: 8 layers, hidden 512): 32 prompts of 16 tokens,
  64 tokens out each, through LLM.generate; seconds (the text engine's step, with its new checks).
The base runs from a git worktree of REV (hardware_matrix/pool_bench.py base_checkout); both sides
load this tree's CPU kernel library (ORTINF_KERNELS_LIB), so only the runtime differs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
TOKENS = 48
WHISPER = dict(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
               decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_source_positions=1500,
               max_target_positions=448, pad_token_id=50257, bos_token_id=50257, eos_token_id=50257, decoder_start_token_id=50258)
BART = dict(vocab_size=8000, d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=128)
TINY_WHISPER = dict(WHISPER, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                    encoder_ffn_dim=128, decoder_ffn_dim=128)
TINY_BART = dict(BART, d_model=64, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=128, decoder_ffn_dim=128)


def build(work: Path, tiny: bool) -> dict[str, Path]:
    """The three packages, exported once by this tree's exporter (the package format is the base's too)."""
    import torch
    import transformers
    from export_llama import TINY  # benchmarks/ is on sys.path (main)
    from export_llama import build as build_llama

    import ortinf

    torch.manual_seed(0)
    whisper = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**(TINY_WHISPER if tiny else WHISPER))).eval()
    whisper.generation_config.suppress_tokens = [WHISPER["eos_token_id"]]  # every window decodes TOKENS tokens, in both runtimes
    whisper.generation_config.begin_suppress_tokens = None
    whisper.save_pretrained(work / "whisper-hf")
    bart = transformers.BartForConditionalGeneration(transformers.BartConfig(**(TINY_BART if tiny else BART))).eval()
    bart.save_pretrained(work / "bart-hf")
    build_llama(work / "llama-hf", **(TINY if tiny else {}))
    packages = {"whisper": work / "whisper", "bart": work / "bart", "llama": work / "llama"}
    for name, source in (("whisper", work / "whisper-hf"), ("bart", work / "bart-hf"), ("llama", work / "llama-hf")):
        ortinf.export(source, packages[name], progress=False)
    return packages


def worker(packages: dict[str, str], tiny: bool) -> dict[str, float]:
    """Runs in the runtime under test (PYTHONPATH): times each workload once, after a warm-up."""
    import time

    import numpy as np

    try:  # this tree
        from ortinf.tasks.speech.transcriber import Transcriber

        whisper = Transcriber(packages["whisper"], max_num_seqs=8, intra_op_threads=2, enable_prefix_caching=False)
    except ImportError:  # the base: its own loop
        from ortinf.runtime.transcriber import Transcriber

        whisper = Transcriber(packages["whisper"], max_windows=8, intra_op_threads=2, enable_prefix_caching=False)
    from ortinf import LLM, SamplingParams

    try:
        from ortinf.runtime.seq2seq import Seq2Seq

        bart = Seq2Seq(packages["bart"], max_seqs=32, intra_op_threads=2, enable_prefix_caching=False).generate_ids
    except ImportError:
        bart = LLM(packages["bart"], max_num_seqs=32, intra_op_threads=2, enable_prefix_caching=False).text2text
    llama = LLM(packages["llama"], max_num_seqs=32, intra_op_threads=2, enable_prefix_caching=False)

    def audio(seconds: float, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        t = np.arange(int(seconds * 16000)) / 16000
        return (0.3 * np.sin(2 * np.pi * (220 + 40 * seed) * t) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)

    rng = np.random.default_rng(0)
    sources = [rng.integers(4, 7000, 24).tolist() + [2] for _ in range(32)]
    prompts = [rng.integers(4, 200, 16).tolist() for _ in range(32)]
    greedy = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    whisper.transcribe_ids([audio(1, 0)], max_new_tokens=2)  # warm-up
    bart(sources[:2], max_new_tokens=2)
    llama.generate(prompts[:2], SamplingParams(max_tokens=2, temperature=0.0))
    times = {}
    start = time.monotonic()
    whisper.transcribe_ids([audio(30, i) for i in range(1 if tiny else 4)], max_new_tokens=TOKENS)
    times["whisper 4 x 30 s"] = (time.monotonic() - start) / (30.0 if tiny else 120.0)
    start = time.monotonic()
    whisper.transcribe_ids([audio(60 if tiny else 150, 7)], max_new_tokens=TOKENS)
    times["whisper 1 x 150 s"] = (time.monotonic() - start) / (60.0 if tiny else 150.0)
    start = time.monotonic()
    bart(sources, max_new_tokens=32)
    times["bart 32 sources"] = time.monotonic() - start
    start = time.monotonic()
    llama.generate(prompts, greedy)
    times["llama 32 x 64 tokens"] = time.monotonic() - start
    return times


def run_side(python: str, tree: Path, packages: dict[str, Path], tiny: bool) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree), ORTINF_KERNELS_LIB=str(ROOT / "ortinf" / "kernels" / "lib" / "libortinf_kernels.so"))
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import one_engine; "
            f"print(json.dumps(one_engine.worker({json.dumps({k: str(v) for k, v in packages.items()})}, {tiny})))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, cwd=tree, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"the run under {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="484b35d", help="The revision before the change [default: 484b35d, issue 30's base].")
    parser.add_argument("--rounds", type=int, default=2, help="Rounds of base then current [default: 2].")
    parser.add_argument("--record", action="store_true", help="Append the table to benchmarks/RESULTS.md.")
    parser.add_argument("--tiny", action="store_true", help="Toy shapes, one round (the test suite's smoke run).")
    args = parser.parse_args()
    sys.path[:0] = [str(HERE), str(ROOT / "hardware_matrix")]  # here, not at import: the worker runs under the base's ortinf
    from decode_step import cpu_flags
    from pool_bench import base_checkout
    from record import finish

    rounds = 1 if args.tiny else args.rounds
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{args.base}^{{commit}}"], capture_output=True).returncode == 0
    if not known and not args.tiny:
        raise SystemExit(f"revision {args.base} is not in this clone: fetch it, or pass --base")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        packages = build(work, args.tiny)
        base = base_checkout(args.base, work) if known else ROOT  # a shallow clone's smoke run: this tree twice
        try:
            results: dict[str, list[dict[str, float]]] = {"base": [], "current": []}
            for _ in range(rounds):
                results["base"].append(run_side(sys.executable, base, packages, args.tiny))
                results["current"].append(run_side(sys.executable, ROOT, packages, args.tiny))
        finally:
            if known:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "base-tree")], capture_output=True)
    lines = [f"### One engine (issue 30): before and after, same run ({args.base} vs this tree, {'toy' if args.tiny else 'full'} shapes)", "",
             f"CPU: {platform.machine()}, {cpu_flags()}; 2 threads; median of {rounds} round(s), base and current alternating in fresh "
             f"processes; Whisper rows are real-time factors (wall / audio seconds), the others seconds; lower is better.", "",
             "| workload | base | one engine | current / base |", "|---|---:|---:|---:|"]
    for name in results["base"][0]:
        before = statistics.median(r[name] for r in results["base"])
        after = statistics.median(r[name] for r in results["current"])
        lines.append(f"| {name} | {before:.4f} | {after:.4f} | {after / before:.2f}x |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
