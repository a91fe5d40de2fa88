"""A small mixture-of-experts model beside a dense model of the same active size, on ortinf and on
llama.cpp (the peer that runs Qwen3-MoE on a CPU here; see below for the others).

usage: .venv/bin/python benchmarks/moe.py [--record] [--tiny] [--passes N] [--work-dir DIR]
       .venv/bin/python benchmarks/moe.py --node LIB [LIB ...] [--passes N]   (the ortinf.MoE node alone)

MoE: a Qwen3-MoE shape scaled down (random weights): 8 layers, hidden 512, 16 experts of 384, 2 per
token: ~90M parameters in all, ~24M active per token. Dense: the same model (Qwen3) with one MLP of
768 per layer, the two active experts' width, so both do the same arithmetic per token when only the
routed experts run. Every engine runs through benchmarks/peers/ (compare.py's protocol): 32 prompts
of 32 tokens at once, and 4 of them one at a time, 64 new tokens each; figures are medians over
`--passes` alternating passes.

Peers: llama.cpp (GGUF written by benchmarks/peers/run_llama_cpp.py, F32 and Q8_0). Not here:
onnxruntime-genai's builder has no Qwen3-MoE or Mixtral (its MoE models are gpt-oss and Phi-3.5-MoE);
OpenVINO's CPU plugin refuses non-Intel CPUs, and this machine's may be AMD.

--node: the ortinf.MoE node alone at the MoE model's shape (8 chained nodes, one session, 2 threads, random experts:
fp32, int8 block 128, int4 block 32; 1 and 32 tokens), each kernel library (ORTINF_KERNELS_LIB) in a process of its
own, the libraries interleaved for --passes rounds; each cell the best of 15 timed runs (a shared machine's
neighbours only ever add time).
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
from compare import Engine, run
from decode_step import cpu_flags
from record import finish

from ortinf.matrix import machine

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


def node(lib: str) -> dict[str, float]:
    """us per ortinf.MoE node in this process (the library already chosen through ORTINF_KERNELS_LIB)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from ortinf.exporter.quantize import qmatmul_tensors, quantize_weight
    from ortinf.kernels import library

    rng = np.random.default_rng(0)
    E, H, I, k, L = 16, SHAPE["hidden_size"], 3 * SHAPE["hidden_size"] // 4, 2, 8
    W = [(rng.normal(0, H**-0.5, (E, H, 2 * I)).astype(np.float32), rng.normal(0, I**-0.5, (E, I, H)).astype(np.float32)) for _ in range(L)]
    figures = {}
    for bits, block in ((0, 0), (8, 128), (4, 32)):
        inits, nodes = [], []
        for layer, weights in enumerate(W):
            names = [f"h{layer}", "logits"]
            for name, w in zip((f"gate_up{layer}", f"down{layer}"), weights, strict=True):
                if bits:
                    packed = [qmatmul_tensors(quantize_weight(w[e], bits, block)) for e in range(E)]
                    tensors = np.stack([p for p, _ in packed]), np.stack([s for _, s in packed])
                else:  # panels of 16 columns (panel_gemm.h)
                    tensors = np.ascontiguousarray(w.reshape(E, w.shape[1], -1, 16).transpose(0, 2, 1, 3)), np.zeros(0, np.float32)
                inits += [numpy_helper.from_array(tensors[0], name), numpy_helper.from_array(tensors[1], name + ".scales")]
                names += [name, name + ".scales"]
            nodes.append(helper.make_node("MoE", names, [f"h{layer + 1}" if layer + 1 < L else "out"], domain="ortinf", top_k=k,
                                          normalize=1, activation=0, bits=bits, block_size=block, hidden_size=H, intermediate_size=I))
        graph = helper.make_graph(nodes, "moe", [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [None, H]),
                                                 helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, E])],
                                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, H])], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        library.register(options)
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for tokens, runs in ((1, 80), (32, 10)):
            feeds = [{"h0": rng.standard_normal((tokens, H)).astype(np.float32) * 0.1,
                      "logits": rng.standard_normal((tokens, E)).astype(np.float32)} for _ in range(16)]
            session.run(None, feeds[0])
            best = float("inf")
            for _ in range(15):
                start = time.perf_counter()
                for i in range(runs):
                    session.run(None, feeds[i % 16])
                best = min(best, (time.perf_counter() - start) / runs / L)
            figures[f"{'int%d' % bits if bits else 'fp32'} {tokens}"] = best * 1e6
    return figures


def nodes(libraries: list[str], passes: int) -> None:
    """The node alone under each library, interleaved (one process per library and round); prints the table."""
    import json
    import os
    import subprocess

    best: dict[str, dict[str, float]] = {}
    for _ in range(passes):
        for lib in libraries:
            done = subprocess.run([sys.executable, __file__, "--node-child", lib], capture_output=True, text=True, check=True,
                                  env={**os.environ, "ORTINF_KERNELS_LIB": lib})
            for key, value in json.loads(done.stdout.strip().splitlines()[-1]).items():
                best.setdefault(lib, {})[key] = min(value, best.get(lib, {}).get(key, float("inf")))
    cells = list(next(iter(best.values())))
    lines = [f"### The ortinf.MoE node alone ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {machine()}; CPU flags {cpu_flags()}. us per node, best of {passes} interleaved rounds x 15 runs.", "",
             "| library | " + " | ".join(f"{c.split()[0]}, {c.split()[1]} token(s)" for c in cells) + " |", "|---|" + "---:|" * len(cells)]
    lines += [f"| {lib} | " + " | ".join(f"{best[lib][c]:.1f}" for c in cells) + " |" for lib in libraries]
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model and short runs (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--passes", type=int, default=2, help="alternating passes over the rows (default 2)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/ortinf-moe"), help="models and converted packages, kept between runs")
    parser.add_argument("--node", nargs="+", metavar="LIB", help="time the ortinf.MoE node alone under each kernel library")
    parser.add_argument("--node-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node_child:
        import json

        print(json.dumps(node(args.node_child)))
        return
    if args.node:
        nodes(args.node, args.passes)
        return
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
