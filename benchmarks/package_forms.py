"""One graph call of the CPU kernel graph (model.cpu.onnx) for several export forms of the same model:
precision, quantization block size and KV cache dtype. What the exporter's defaults are chosen from.

usage: .venv/bin/python benchmarks/package_forms.py [--forms DTYPE:BLOCK:KV ...] [--rounds N] [--record] [--tiny]

A form is `dtype:block_size:kv_dtype`, e.g. `int8:32:fp32` (block size is ignored at fp32). The step
cases are benchmarks/decode_step.py's (a 32-sequence decode at context 190, one sequence at 190, a
16 x 126 prefill), blocks shuffled over the pool; the forms run in alternating rounds (one session
alive at a time), each figure the median over all rounds' repeats. The quality columns are the
export's own gate figures (top-1 agreement and mean KL against the fp32 model, random weights).
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_step import BLOCK_SIZE, NUM_BLOCKS, THREADS, chunks_for, cpu_flags, time_ms
from export_llama import TINY, build
from record import finish

import ortinf
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import build_model_input

DEFAULT_FORMS = ["fp32:0:fp32", "int8:32:fp32", "int8:128:fp32", "int8:128:fp16", "int4:32:fp32", "int4:32:fp16"]


def step_cases(tiny: bool) -> list[tuple[str, list[tuple[int, int]], int]]:
    if tiny:
        return [("decode, 4 seqs at 40", [(40, 1)] * 4, 2), ("prefill, 2 x 20", [(0, 20)] * 2, 1)]
    return [("decode, 32 seqs at 190", [(190, 1)] * 32, 10), ("decode, 1 seq at 190", [(190, 1)], 40),
            ("prefill, 16 x 126", [(0, 126)] * 16, 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forms", nargs="*", default=DEFAULT_FORMS, help="dtype:block_size:kv_dtype per form")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds over the forms (default 3)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model, two forms, few repeats (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    forms = ["fp32:0:fp32", "int8:32:fp16"] if args.tiny else args.forms
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(root / "hf", **(TINY if args.tiny else {}))
        packages, quality = {}, {}
        for form in forms:
            dtype, block, kv = form.split(":")
            options = {"quant_block_size": int(block)} if dtype != "fp32" else {}
            manifest = ortinf.export(root / "hf", root / form.replace(":", "-"), dtype=dtype, kv_dtype=kv, progress=False, **options)
            if manifest.cpu_kernel is None:
                raise SystemExit("the package has no CPU kernel graph: build the library (python ortinf/kernels/build.py) first")
            packages[form] = root / form.replace(":", "-")
            q = manifest.quality
            quality[form] = f"{q.top1_agreement:.3f} | {q.mean_kl:.4f}" if q else "exact | exact"
        vocab = manifest.decoder.vocab_size
        steps = [(name, build_model_input(chunks_for(lengths, rng, vocab), BLOCK_SIZE), repeats)
                 for name, lengths, repeats in step_cases(args.tiny)]
        times: dict[tuple[str, str], list[float]] = defaultdict(list)
        for _ in range(1 if args.tiny else args.rounds):
            for form, package in packages.items():
                graph = DecoderGraph(package, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, provider="cpu",
                                     intra_op_threads=THREADS, cpu_kernel=True)
                for name, model_input, repeats in steps:
                    times[name, form] += time_ms(graph, model_input, repeats)
                del graph
                gc.collect()
    names = [name for name, _, _ in steps]
    lines = [f"### Export forms on the CPU kernel graph, {'tiny 2-layer' if args.tiny else '33.6M'} llama, {THREADS} threads",
             "", f"CPU: {platform.machine()}, {cpu_flags()}; ms per call, medians over {args.rounds} alternating rounds.", "",
             f"| dtype:block:kv | {' | '.join(names)} | top-1 | KL |", f"|---|{'---:|' * len(names)}---:|---:|"]
    for form in forms:
        cells = " | ".join(f"{statistics.median(times[name, form]):.2f}" for name in names)
        lines.append(f"| {form} | {cells} | {quality[form]} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
