"""Offline throughput: ortinf's engine beside transformers and Optimum, in the same run.

usage: .venv/bin/python benchmarks/offline.py [--record] [--skip-baselines] [--tiny]

Workload (issue 3): 32 requests with distinct random-token prompts of 64 + 4i tokens (i = 0..31),
128 new tokens each, ignore_eos, greedy, on the 33.6M llama (hidden 512, 8 layers, 8 heads, 4 KV
heads, vocab 8192) at fp32, 2 threads everywhere. A second workload gives all prompts a shared
64-token prefix and runs ortinf with prefix caching on and off.

The machines are noisy (a shared VM; run-to-run spread of 10-15% seen), so the fast runs (ortinf and
Optimum) are repeated REPEATS times, interleaved (ortinf, Optimum, ortinf, Optimum, ...: a drift in
the machine's speed moves both), and the run with the median throughput is reported, with the ratio
of each interleaved pair; the slow transformers baselines run once (their ratios are far from the
targets).

Reported: output tokens/s (all output tokens / wall time), mean TTFT (from a request's submission
to its first token; for one-at-a-time runs, from that request's own start) and mean TPOT (time per
output token after the first).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from export_llama import TINY, build, report
from run_hf import StepClock

import ortinf
from ortinf import LLM, SamplingParams

NUM_REQUESTS, NEW_TOKENS, THREADS = 32, 128, 2
REPEATS = 5


def median_row(rows: list[Row]) -> Row:
    """The run with the median throughput."""
    return sorted(rows, key=lambda row: row.throughput)[len(rows) // 2]


@dataclass
class Row:
    name: str
    tokens: int
    seconds: float
    ttft: float
    tpot: float

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds


VOCAB = 8192


def workload(shared_prefix: int = 0, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    prefix = rng.integers(3, VOCAB, shared_prefix).tolist()
    return [prefix + rng.integers(3, VOCAB, 64 + 4 * i - shared_prefix).tolist() for i in range(NUM_REQUESTS)]


def run_ortinf(package: Path, prompts: list[list[int]], name: str, **options) -> Row:
    llm = LLM(package, provider="cpu", intra_op_threads=THREADS, max_num_seqs=64, **options)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    llm.generate(workload(seed=1)[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up (other prompts: no cache hits)
    start = time.monotonic()
    outputs = llm.generate(prompts, params)
    seconds = time.monotonic() - start
    ttfts = [o.metrics.first_token_time - o.metrics.arrival_time for o in outputs]
    tpots = [(o.metrics.finished_time - o.metrics.first_token_time) / (NEW_TOKENS - 1) for o in outputs]
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert tokens == NUM_REQUESTS * NEW_TOKENS if len(prompts) == NUM_REQUESTS else True
    return Row(name, tokens, seconds, statistics.mean(ttfts), statistics.mean(tpots))


def hf_generate(model, prompts: list[list[int]], pad_id: int = 0) -> tuple[int, float, float, float]:
    """One padded (left) batch through model.generate: (tokens, seconds, ttft, tpot)."""
    from transformers import StoppingCriteriaList

    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest - len(prompt) :] = 1
    clock = StepClock()
    start = time.monotonic()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=pad_id, stopping_criteria=StoppingCriteriaList([clock]))
    seconds = time.monotonic() - start
    tokens = (out.shape[1] - longest) * len(prompts)
    ttft = clock.times[0] - start
    tpot = (clock.times[-1] - clock.times[0]) / max(len(clock.times) - 1, 1)
    return tokens, seconds, ttft, tpot


def run_hf_one_at_a_time(model, prompts) -> Row:
    results = [hf_generate(model, [p]) for p in prompts]
    return Row("transformers generate, one at a time", sum(r[0] for r in results), sum(r[1] for r in results),
               statistics.mean(r[2] for r in results), statistics.mean(r[3] for r in results))


def run_hf_batch(model, prompts, name: str) -> Row:
    tokens, seconds, ttft, tpot = hf_generate(model, prompts)
    return Row(name, tokens, seconds, ttft, tpot)


def load_optimum(hf_dir: Path, out_dir: Path):
    import onnxruntime as ort
    from optimum.onnxruntime import ORTModelForCausalLM

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    ORTModelForCausalLM.from_pretrained(hf_dir, export=True).save_pretrained(out_dir)
    return ORTModelForCausalLM.from_pretrained(out_dir, session_options=options, provider="CPUExecutionProvider")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="append the tables to benchmarks/RESULTS.md")
    parser.add_argument("--skip-baselines", action="store_true", help="run ortinf only (for quick iterations)")
    parser.add_argument("--tiny", action="store_true", help="2-layer model, 4 requests x 8 tokens, one run each (smoke test)")
    args = parser.parse_args()
    global NUM_REQUESTS, NEW_TOKENS, REPEATS, VOCAB
    if args.tiny:
        NUM_REQUESTS, NEW_TOKENS, REPEATS, VOCAB = 4, 8, 1, TINY["vocab_size"]
    torch.set_num_threads(THREADS)
    prompts = workload()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root / "hf", **(TINY if args.tiny else {}))
        ortinf.export(root / "hf", root / "pkg", progress=False)
        runs: dict[str, list[Row]] = {}
        contenders = {
            "ortinf, 32 concurrent requests": lambda: run_ortinf(root / "pkg", prompts, "ortinf, 32 concurrent requests"),
            "ortinf, 1 request": lambda: run_ortinf(root / "pkg", prompts[NUM_REQUESTS // 2:NUM_REQUESTS // 2 + 1], "ortinf, 1 request"),
        }
        if not args.skip_baselines:
            import transformers

            model = transformers.AutoModelForCausalLM.from_pretrained(root / "hf").eval()
            optimum = load_optimum(root / "hf", root / "optimum")
            run_hf_batch(optimum, prompts[:2], "warm-up")
            contenders["Optimum ORTModelForCausalLM, padded batch of 32"] = lambda: run_hf_batch(
                optimum, prompts, "Optimum ORTModelForCausalLM, padded batch of 32")
            contenders["Optimum ORTModelForCausalLM, 1 request"] = lambda: run_hf_batch(
                optimum, prompts[NUM_REQUESTS // 2:NUM_REQUESTS // 2 + 1], "Optimum ORTModelForCausalLM, 1 request")
        # Interleaved repeats: a machine that speeds up or slows down during the run moves both sides.
        for _ in range(REPEATS):
            for name, run in contenders.items():
                runs.setdefault(name, []).append(run())
        median = {name: median_row(rows_of) for name, rows_of in runs.items()}
        rows.append(median["ortinf, 32 concurrent requests"])
        single = median["ortinf, 1 request"]
        if not args.skip_baselines:
            rows.append(median["Optimum ORTModelForCausalLM, padded batch of 32"])
            optimum_single = median["Optimum ORTModelForCausalLM, 1 request"]
            rows.append(run_hf_batch(model, prompts, "transformers generate, padded batch of 32"))
            rows.append(run_hf_one_at_a_time(model, prompts))
            pair_ratios = [a.throughput / b.throughput for a, b in zip(runs["ortinf, 32 concurrent requests"],
                                                                       runs["Optimum ORTModelForCausalLM, padded batch of 32"])]
        prefix_rows = [
            run_ortinf(root / "pkg", workload(shared_prefix=64), "ortinf, shared 64-token prefix, caching on", enable_prefix_caching=True),
            run_ortinf(root / "pkg", workload(shared_prefix=64), "ortinf, shared 64-token prefix, caching off", enable_prefix_caching=False),
        ]
    ratio = {}
    if not args.skip_baselines:
        ratio = {"Optimum padded batch": rows[0].throughput / rows[1].throughput,
                 "transformers one at a time": rows[0].throughput / rows[3].throughput}
    lines = [
        f"### Offline: 32 requests x 128 new tokens, 33.6M llama fp32, {THREADS} threads ({platform.machine()}, {platform.python_version()}); "
        f"ortinf and Optimum: median of {REPEATS} runs",
        "",
        "| engine | output tok/s | mean TTFT ms | mean TPOT ms | wall s |",
        "|---|---:|---:|---:|---:|",
    ]
    table_rows = rows + [single] + ([optimum_single] if not args.skip_baselines else []) + prefix_rows
    lines += [f"| {r.name} | {r.throughput:,.0f} | {r.ttft * 1e3:,.0f} | {r.tpot * 1e3:.1f} | {r.seconds:.1f} |" for r in table_rows]
    if ratio:
        lines += ["", "ortinf's output tokens/s over: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()),
                  "ortinf over Optimum's padded batch in each interleaved pair of runs: " + ", ".join(f"{r:.2f}x" for r in pair_ratios),
                  f"single-request TPOT: ortinf {single.tpot * 1e3:.1f} ms vs Optimum {optimum_single.tpot * 1e3:.1f} ms"]
    text = "\n".join(lines) + "\n"
    report(text, args.record)


if __name__ == "__main__":
    main()
