"""Export time and package size of a ~30M-parameter llama, beside Optimum's ONNX export of the same model.

usage: .venv/bin/python benchmarks/export_llama.py [--record] [--tiny]

The model is the engine benchmark's (hidden 512, 8 layers, 8 heads, 4 KV heads, vocab 8192,
intermediate 1536; random weights, fp32). --record appends the table to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch
import transformers

import ortinf

RESULTS = Path(__file__).with_name("RESULTS.md")


# --tiny (the smoke test that keeps every benchmark script running): a 2-layer model of the same shape family.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def build(folder: Path, **overrides: int) -> int:
    """Saves the benchmark llama (random weights; `overrides` change its config) to `folder`."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{
        **dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
               num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048),
        **overrides,
    })
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def report(text: str, record: bool) -> None:
    """Prints a results table and, with --record, appends it to benchmarks/RESULTS.md."""
    print(text)
    if record:
        with RESULTS.open("a", encoding="utf-8") as fh:
            fh.write("\n" + text)


def size_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (smoke test)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        params = build(root / "hf", **(TINY if args.tiny else {}))
        rows = []
        start = time.perf_counter()
        manifest = ortinf.export(root / "hf", root / "ortinf", progress=False)
        rows.append(("ortinf export (trace + verify)", time.perf_counter() - start, size_mib(root / "ortinf"), f"{manifest.parity.max_abs_diff:.2e}"))
        try:
            from optimum.exporters.onnx import main_export

            start = time.perf_counter()
            main_export(str(root / "hf"), output=str(root / "optimum"), task="text-generation-with-past", no_post_process=False)
            rows.append(("optimum-onnx main_export (with past)", time.perf_counter() - start, size_mib(root / "optimum"), "its own check"))
        except Exception as exc:  # noqa: BLE001 - the baseline is optional; say why it is missing
            rows.append((f"optimum-onnx: failed ({type(exc).__name__})", float("nan"), float("nan"), str(exc)[:60]))
    header = f"Export of a {params / 1e6:.1f}M-parameter llama (fp32), {platform.processor() or platform.machine()}, torch threads 2"
    table = ["| exporter | seconds | package MiB | max abs diff vs PyTorch |", "|---|---:|---:|---|"]
    table += [f"| {name} | {secs:.1f} | {mib:.1f} | {diff} |" for name, secs, mib, diff in rows]
    report("\n".join([f"### {header}", "", *table, ""]), args.record)


if __name__ == "__main__":
    main()
