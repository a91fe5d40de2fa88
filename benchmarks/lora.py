"""Multi-LoRA cost: the same model with and without LoRA inputs, and batches of one adapter, of four
adapters mixed, and of the base model only.

usage: .venv/bin/python benchmarks/lora.py [--record] [--tiny] [--passes N]

Model: a Qwen3 shape (random weights, 8 layers, hidden 512, MLP 1536, vocab 8192), fp32, CPU kernel
graph. Adapters: rank 16 on all seven projections (PEFT, random weights). Rows: the package exported
without --enable-lora; with LoRA inputs and no adapter loaded; one adapter for every request; four
adapters, requests spread over them and the base model. Tokens/s one request at a time and 32 at once.
"""

from __future__ import annotations

import argparse
import copy
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
from decode_step import cpu_flags
from record import finish

import ortinf
from ortinf import LLM, SamplingParams

SHAPE = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=4, head_dim=64, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
TINY = dict(SHAPE, hidden_size=128, intermediate_size=256, num_hidden_layers=2, head_dim=32, vocab_size=1024)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def measure(llm: LLM, prompts: list[list[int]], loras: list[str | None], new_tokens: int) -> tuple[float, float]:
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), lora=loras[:2])  # warm-up
    tpots = []
    for prompt, lora in list(zip(prompts, loras))[:4]:
        output = llm.generate([prompt], params, lora=lora)[0]
        tpots.append((output.metrics.finished_time - output.metrics.first_token_time) / (new_tokens - 1))
    start = time.monotonic()
    llm.generate(prompts, params, lora=loras)
    return 1 / statistics.median(tpots), len(prompts) * new_tokens / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and short runs (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--passes", type=int, default=2, help="alternating passes over the rows (default 2)")
    args = parser.parse_args()
    shape, new_tokens, count = (TINY, 8, 4) if args.tiny else (SHAPE, 64, 32)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, shape["vocab_size"], 32).tolist() for _ in range(count)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        torch.manual_seed(0)
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape)).eval()
        model.save_pretrained(root / "hf")
        import peft

        adapters = {}
        for index in range(4):
            torch.manual_seed(index + 1)
            peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=16, lora_alpha=32, init_lora_weights=False, target_modules=TARGETS)
                                ).save_pretrained(root / f"lora{index}")
            adapters[f"lora{index}"] = str(root / f"lora{index}")
        ortinf.export(root / "hf", root / "plain", progress=False)
        ortinf.export(root / "hf", root / "lora", progress=False, enable_lora=True)
        rows = {  # name -> (package, engine options, the adapter of each prompt)
            "no LoRA inputs (plain export)": (root / "plain", {}, [None] * count),
            "LoRA inputs, no adapter loaded": (root / "lora", {}, [None] * count),
            "1 adapter, every request": (root / "lora", {"lora_modules": {"lora0": adapters["lora0"]}}, ["lora0"] * count),
            "4 adapters + base, mixed": (root / "lora", {"lora_modules": adapters}, [([*adapters, None])[i % 5] for i in range(count)]),
        }
        results: dict[str, list[tuple[float, float]]] = {}
        for _ in range(1 if args.tiny else args.passes):
            for name, (package, options, loras) in rows.items():
                llm = LLM(package, provider="cpu", max_num_seqs=64, enable_prefix_caching=False, **options)
                results.setdefault(name, []).append(measure(llm, prompts, loras, new_tokens))
                del llm
    lines = [f"### Multi-LoRA: rank-16 adapters on all projections ({time.strftime('%Y-%m-%d')})", "",
             f"CPU: {platform.machine()}, {cpu_flags()}; Qwen3 shape, {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
             f"fp32; {count} prompts of 32 tokens, {new_tokens} new tokens; medians of {len(next(iter(results.values())))} passes.", "",
             "| package and batch | tok/s, 1 at a time | tok/s, 32 at once |", "|---|---:|---:|"]
    for name, runs in results.items():
        lines.append(f"| {name} | {statistics.median(r[0] for r in runs):.0f} | {statistics.median(r[1] for r in runs):.0f} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
