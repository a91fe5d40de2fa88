"""A small mixture-of-experts model beside a dense model of the same active size, on ortinf and on
llama.cpp (the peer that runs Qwen3-MoE on a CPU here; see below for the others).

usage: .venv/bin/python benchmarks/moe.py [--record] [--tiny] [--passes N] [--work-dir DIR]

MoE: a Qwen3-MoE shape scaled down (random weights): 8 layers, hidden 512, 16 experts of 384, 2 per
token: ~90M parameters in all, ~24M active per token. Dense: the same model (Qwen3) with one MLP of
768 per layer, the two active experts' width, so both do the same arithmetic per token when only the
routed experts run. Every engine runs through benchmarks/peers/ (compare.py's protocol): 32 prompts
of 32 tokens at once, and 4 of them one at a time, 64 new tokens each; figures are medians over
`--passes` alternating passes.

Peers: llama.cpp (GGUF written by benchmarks/peers/run_llama_cpp.py, F32 and Q8_0). Not here:
onnxruntime-genai's builder has no Qwen3-MoE or Mixtral (its MoE models are gpt-oss and Phi-3.5-MoE);
OpenVINO's CPU plugin refuses non-Intel CPUs, and this machine's may be AMD.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import Engine, run  # noqa: E402
from decode_step import cpu_flags  # noqa: E402
from record import finish  # noqa: E402

from ortinf.matrix import machine  # noqa: E402

SHAPE = dict(vocab_size=8192, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
             max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
TINY = dict(SHAPE, hidden_size=128, num_hidden_layers=2, head_dim=32, vocab_size=1024)
ENGINES = [
    Engine("ortinf", "ortinf", ".venv", "fp32", "fp32"),
    Engine("ortinf", "ortinf", ".venv", "int8", "int8"),
    Engine("llama.cpp", "llama_cpp", ".venv-bench-llamacpp", "fp32", "fp32"),
    Engine("llama.cpp", "llama_cpp", ".venv-bench-llamacpp", "int8", "q8_0"),
]


def build(folder: Path, moe: bool, shape: dict) -> int:
    if (folder / "config.json").exists():
        return int((folder / "params.txt").read_text())
    torch.manual_seed(0)
    if moe:
        config = transformers.Qwen3MoeConfig(**shape, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=3 * shape["hidden_size"] // 4,
                                             norm_topk_prob=True, intermediate_size=3 * shape["hidden_size"] // 2)
        model = transformers.Qwen3MoeForCausalLM(config)
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape, intermediate_size=3 * shape["hidden_size"] // 2))
    model.eval().save_pretrained(folder)
    count = sum(p.numel() for p in model.parameters())
    (folder / "params.txt").write_text(str(count))
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and short runs (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--passes", type=int, default=2, help="alternating passes over the rows (default 2)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/ortinf-moe"), help="models and converted packages, kept between runs")
    args = parser.parse_args()
    shape, new_tokens, count = (TINY, 8, 4) if args.tiny else (SHAPE, 64, 32)
    work = args.work_dir / ("tiny" if args.tiny else "full")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, shape["vocab_size"], 32).tolist() for _ in range(count)]
    sizes = {name: build(work / name / "hf", name == "MoE", shape) for name in ("MoE", "dense")}
    engines = ENGINES[:2] if args.tiny else ENGINES
    results: dict[tuple[str, Engine], dict[str, list[float]]] = {}
    errors: dict[tuple[str, Engine], str] = {}
    for _ in range(1 if args.tiny else args.passes):
        for engine in engines:
            for name in sizes:
                for mode, prompt_set in (("batch", prompts), ("single", prompts[:4])):
                    row = run(engine, mode, work / name, work / name / "hf", prompt_set, timeout=1800, new_tokens=new_tokens)
                    if row.result is None:
                        errors[name, engine] = row.error
                        continue
                    figure = row.throughput if mode == "batch" else 1 / statistics.median(row.result["tpot"])
                    results.setdefault((name, engine), {}).setdefault(mode, []).append(figure)
    lines = [f"### Mixture of experts vs dense of the same active size ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {machine()}; CPU flags {cpu_flags()}. MoE {sizes['MoE'] / 1e6:.0f}M parameters (Qwen3-MoE, 16 experts, "
             f"2 active), dense {sizes['dense'] / 1e6:.0f}M (Qwen3); {count} prompts of 32 tokens, {new_tokens} new tokens; "
             f"medians of {1 if args.tiny else args.passes} passes.", "",
             "| engine | precision | model | tok/s, 1 at a time | tok/s, 32 at once | MoE / dense at once |", "|---|---|---|---:|---:|---:|"]
    for engine in engines:
        dense = results.get(("dense", engine), {}).get("batch")
        for name in sizes:
            figures = results.get((name, engine))
            if figures is None:
                lines.append(f"| {engine.name} | {engine.precision} | {name} | {errors.get((name, engine), 'no result')} | | |")
                continue
            batch = statistics.median(figures["batch"])
            ratio = f"{batch / statistics.median(dense):.2f}x" if name == "MoE" and dense else ""
            lines.append(f"| {engine.name} | {engine.precision} | {name} | {statistics.median(figures['single']):.0f} | {batch:.0f} | {ratio} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
