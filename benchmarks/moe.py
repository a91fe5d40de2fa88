"""A small mixture-of-experts model beside a dense model of the same active size, on ortinf's engine.

usage: .venv/bin/python benchmarks/moe.py [--record] [--tiny] [--passes N]

MoE: a Qwen3-MoE shape scaled down (random weights): 8 layers, hidden 512, 16 experts of 384, 2 per
token: ~95M parameters in all, ~24M active per token. Dense: the same model with one MLP of 768 per
layer (the two active experts' width), so both do the same work per token if the MoE graph runs only
the routed experts; the MoE model has 16x the expert weights to keep in memory and to route over.
Rows: fp32 and int8 packages; tokens/s with 1 request at a time (TPOT) and with 32 at once.
The two models run alternately, `--passes` times; figures are medians.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_step import cpu_flags  # noqa: E402
from record import finish  # noqa: E402

import ortinf  # noqa: E402
from ortinf import LLM, SamplingParams  # noqa: E402

SHAPE = dict(vocab_size=8192, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
             max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
TINY = dict(SHAPE, hidden_size=128, num_hidden_layers=2, head_dim=32, vocab_size=1024)


def build(folder: Path, moe: bool, shape: dict) -> int:
    torch.manual_seed(0)
    if moe:
        config = transformers.Qwen3MoeConfig(**shape, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=3 * shape["hidden_size"] // 4,
                                             norm_topk_prob=True, intermediate_size=3 * shape["hidden_size"] // 2)
        model = transformers.Qwen3MoeForCausalLM(config)
    else:
        config = transformers.Qwen3Config(**shape, intermediate_size=3 * shape["hidden_size"] // 2)
        model = transformers.Qwen3ForCausalLM(config)
    model.eval().save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def measure(package: Path, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """(tokens/s one request at a time, tokens/s with all at once)."""
    llm = LLM(package, provider="cpu", max_num_seqs=64, enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    tpots = []
    for prompt in prompts[:4]:
        output = llm.generate([prompt], params)[0]
        tpots.append((output.metrics.finished_time - output.metrics.first_token_time) / (new_tokens - 1))
    start = time.monotonic()
    llm.generate(prompts, params)
    return 1 / statistics.median(tpots), len(prompts) * new_tokens / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and short runs (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--passes", type=int, default=2, help="alternating passes over the models (default 2)")
    args = parser.parse_args()
    shape, new_tokens, count = (TINY, 8, 4) if args.tiny else (SHAPE, 64, 32)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, shape["vocab_size"], 32).tolist() for _ in range(count)]
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        packages = {}
        for name, moe in (("MoE", True), ("dense", False)):
            sizes[name] = build(Path(tmp) / name, moe, shape)
            for dtype in ("fp32", "int8"):
                packages[name, dtype] = Path(tmp) / f"{name}-{dtype}"
                ortinf.export(Path(tmp) / name, packages[name, dtype], dtype=dtype, progress=False)
        for _ in range(1 if args.tiny else args.passes):
            for key, package in packages.items():
                results.setdefault(key, []).append(measure(package, prompts, new_tokens))
    lines = [f"### Mixture of experts vs dense of the same active size ({time.strftime('%Y-%m-%d')})", "",
             f"CPU: {platform.machine()}, {cpu_flags()}; MoE {sizes['MoE'] / 1e6:.0f}M parameters (16 experts, 2 active), "
             f"dense {sizes['dense'] / 1e6:.0f}M; {len(prompts)} prompts of 32 tokens, {new_tokens} new tokens; medians of "
             f"{len(next(iter(results.values())))} passes.", "",
             "| model | precision | tok/s, 1 at a time | tok/s, 32 at once |", "|---|---|---:|---:|"]
    for (name, dtype), runs in results.items():
        lines.append(f"| {name} | {dtype} | {statistics.median(r[0] for r in runs):.0f} | {statistics.median(r[1] for r in runs):.0f} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
