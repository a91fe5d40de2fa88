"""Three ways to give each token its own LoRA adapter in one graph call, measured on the same stack
of linear layers under ONNX Runtime (CPU): why ortinf/exporter/lora.py masks instead of gathering or grouping.

usage: .venv/bin/python benchmarks/lora_layouts.py [--record] [--tiny]

A stack of 8 linear layers (hidden 1024) with 4 adapters of rank 16 loaded, every token's adapter
chosen at random (the base model for a fifth of them), A/B as graph inputs as the runtime binds them:
- masked (ortinf): ((x @ A_all) * mask) @ B_all, the adapters side by side in one width (64);
- gathered: each token's A and B gathered by its slot, then a batched MatMul per token;
- grouped: per adapter, NonZero picks its tokens, their delta is computed and scattered back;
- none: the same stack without LoRA (the floor).
Figures: ms per call, median of 30 calls, 2 threads, for 1, 32 and 512 tokens.
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
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_step import cpu_flags
from record import finish

LAYERS, HIDDEN, ADAPTERS, RANK = 8, 1024, 4, 16


class Stack(torch.nn.Module):
    def __init__(self, layout: str, layers: int, hidden: int) -> None:
        super().__init__()
        self.layout = layout
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(hidden, hidden) * 0.02) for _ in range(layers)])

    def forward(self, x, slots, mask, *per_layer):  # per layer: a [S, H, r], b [S, r, H], a_flat [H, S*r], b_flat [S*r, H]
        for layer, weight in enumerate(self.weights):
            a, b, a_flat, b_flat = per_layer[4 * layer : 4 * layer + 4]  # one input each, as the runtime binds them
            y = x @ weight
            if self.layout == "masked":  # as ortinf/exporter/lora.py and ortinf/runtime/worker/lora.py lay them out
                y = y + ((x @ a_flat) * mask) @ b_flat
            elif self.layout == "gathered":
                y = y + torch.matmul(torch.matmul(x[:, None, :], a[slots]), b[slots])[:, 0]
            elif self.layout == "grouped":
                for slot in range(a.shape[0]):
                    rows = torch.nonzero(slots == slot)[:, 0]
                    y = y.index_put((rows,), (x[rows] @ a[slot]) @ b[slot], accumulate=True)
            x = y
        return x


def session(layout: str, folder: Path, layers: int, hidden: int) -> ort.InferenceSession:
    model = Stack(layout, layers, hidden).eval()
    per_layer = [t for _ in range(layers) for t in (torch.randn(ADAPTERS, hidden, RANK), torch.randn(ADAPTERS, RANK, hidden),
                                                    torch.randn(hidden, ADAPTERS * RANK), torch.randn(ADAPTERS * RANK, hidden))]
    example = (torch.randn(4, hidden), torch.tensor([0, 1, -1, 2]), torch.rand(4, ADAPTERS * RANK), *per_layer)
    path = folder / f"{layout}.onnx"
    with torch.no_grad():
        names = ["x", "slots", "mask", *(f"{n}{i}" for i in range(layers) for n in ("a", "b", "a_flat", "b_flat"))]
        torch.onnx.export(model, example, str(path), dynamo=False, input_names=names, output_names=["y"],
                          dynamic_axes={"x": {0: "t"}, "slots": {0: "t"}, "mask": {0: "t"}}, opset_version=17)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds(tokens: int, layers: int, hidden: int, rng: np.random.Generator, names: set[str]) -> dict[str, np.ndarray]:
    slots = rng.integers(-1, ADAPTERS, tokens)  # -1: the base model
    mask = np.zeros((tokens, ADAPTERS * RANK), np.float32)
    for t, s in enumerate(slots):
        if s >= 0:
            mask[t, s * RANK : (s + 1) * RANK] = 2.0
    a = rng.standard_normal((layers, ADAPTERS, hidden, RANK)).astype(np.float32) * 0.01
    b = rng.standard_normal((layers, ADAPTERS, RANK, hidden)).astype(np.float32) * 0.01
    everything = {"x": rng.standard_normal((tokens, hidden)).astype(np.float32), "slots": slots.astype(np.int64), "mask": mask}
    for i in range(layers):
        everything.update({f"a{i}": a[i], f"b{i}": b[i], f"a_flat{i}": np.ascontiguousarray(a[i].transpose(1, 0, 2).reshape(hidden, -1)),
                           f"b_flat{i}": np.ascontiguousarray(b[i].reshape(-1, hidden))})
    return {k: v for k, v in everything.items() if k in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="2 layers of 128 (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    layers, hidden, calls = (2, 128, 3) if args.tiny else (LAYERS, HIDDEN, 30)
    rng = np.random.default_rng(0)
    sizes = (1, 32, 512)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layout in ("none", "masked", "gathered", "grouped"):
            sess = session(layout, Path(tmp), layers, hidden)
            names = {i.name for i in sess.get_inputs()}
            rows[layout] = []
            for tokens in sizes:
                inputs = feeds(tokens, layers, hidden, rng, names)
                sess.run(None, inputs)
                times = []
                for _ in range(calls):
                    start = time.perf_counter()
                    sess.run(None, inputs)
                    times.append((time.perf_counter() - start) * 1e3)
                rows[layout].append(statistics.median(times))
    lines = [f"### LoRA layouts in one graph call ({time.strftime('%Y-%m-%d')})", "",
             f"CPU: {platform.machine()}, {cpu_flags()}; {layers} linear layers of {hidden}, {ADAPTERS} adapters of rank {RANK}, "
             "2 threads; ms per call, medians.", "",
             "| layout | " + " | ".join(f"{t} tokens" for t in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for layout, figures in rows.items():
        lines.append(f"| {layout} | " + " | ".join(f"{f:.2f}" for f in figures) + " |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
