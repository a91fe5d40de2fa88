"""Beam search: ortinf's (one step request per live beam, history shared through the prefix cache) beside
transformers' generate(num_beams=k) on the same model, and beside ortinf's own greedy decoding.

usage: .venv/bin/python benchmarks/beam_search.py [--size toy|0.5b] [--tiny] [--passes N] [--record]

The benchmark llama (benchmarks/compare.py's shapes, random weights), 8 prompts of 32 + 8i tokens, 32 new
tokens, 4 beams, the 4 best returned, no EOS stop (--tiny: 2 layers, 2 prompts, 8 tokens). transformers
runs each prompt alone (its beams batched); ortinf gets all prompts at once. Reported: wall time (median of
--passes, interleaved), tokens per second of the best hypotheses, and whether the hypotheses equal
transformers' token for token. ortinf runs with 16-token blocks (each step recomputes the part of every beam
past its last full block) and, for the cost of that, with 4-token blocks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from compare import SIZES, build_model  # noqa: E402
from record import finish  # noqa: E402

from ortinf.matrix import machine  # noqa: E402

BEAMS = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["toy", "0.5b"], default="toy", help="the benchmark llama's shape (benchmarks/compare.py)")
    parser.add_argument("--tiny", action="store_true", help="2 layers, 2 prompts, 8 tokens (the smoke test)")
    parser.add_argument("--passes", type=int, default=1, help="interleaved passes; each row reports its median")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    import numpy as np
    import torch
    import transformers

    from ortinf import LLM, SamplingParams, export

    torch.set_num_threads(2)
    count, new_tokens = (2, 8) if args.tiny else (8, 32)
    work = Path(tempfile.mkdtemp(prefix="ortinf-beams-"))
    build_model(work / "hf", tiny=args.tiny, size=args.size)
    export(work / "hf", work / "pkg", progress=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(work / "hf", dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    prompt_set = [rng.integers(3, vocab, 32 + 8 * i).tolist() for i in range(count)]
    beams = SamplingParams(num_beams=BEAMS, n=BEAMS, max_tokens=new_tokens, ignore_eos=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    engines = {block: LLM(work / "pkg", provider="cpu", intra_op_threads=2, block_size=block) for block in (16, 4)}

    def hf() -> list[list[list[int]]]:
        out = []
        with torch.no_grad():
            for prompt in prompt_set:
                rows = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), num_beams=BEAMS,
                                      num_return_sequences=BEAMS, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      do_sample=False, pad_token_id=0)
                out.append(rows[:, len(prompt):].tolist())
        return out

    def ortinf(block: int, params: SamplingParams):
        return lambda: [[c.token_ids for c in o.outputs] for o in engines[block].generate(prompt_set, params)]

    rows = {"transformers generate(num_beams=4), one prompt at a time": hf,
            "ortinf beams, all prompts at once, block 16": ortinf(16, beams),
            "ortinf beams, all prompts at once, block 4": ortinf(4, beams),
            "ortinf greedy (n=1), all prompts at once, block 16": ortinf(16, greedy)}
    times: dict[str, list[float]] = {name: [] for name in rows}
    results = {}
    for _ in range(args.passes):
        for name, run in rows.items():
            start = time.monotonic()
            results[name] = run()
            times[name].append(time.monotonic() - start)
    reference = results["transformers generate(num_beams=4), one prompt at a time"]
    config = SIZES[args.size].config
    shape = "tiny" if args.tiny else f"{args.size}, hidden {config['hidden_size']}, {config['num_hidden_layers']} layers"
    lines = [f"### Beam search ({shape} llama; "
             f"{count} prompts x {new_tokens} tokens, {BEAMS} beams, {args.passes} pass(es))", "", f"Machine: {machine()}", "",
             "| run | seconds | best-hypothesis tok/s | hypotheses = transformers |", "|---|---|---|---|"]
    for name in rows:
        seconds = statistics.median(times[name])
        same = "-" if "greedy" in name else f"{sum(r == e for r, e in zip(results[name], reference))}/{count}"
        lines.append(f"| {name} | {seconds:.2f} | {count * new_tokens / seconds:.1f} | {same} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
