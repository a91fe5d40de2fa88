"""ortinf beside the engines a user would pick instead, on one workload, in one run.

usage: .venv/bin/python benchmarks/compare.py [--size toy|0.5b|1.5b|3b|7b] [--passes N] [--only ENGINE ...] [--record] [--tiny]

Workload, --size toy (benchmarks/offline.py's): the 33.6M llama (hidden 512, 8 layers, 8 heads, 4 KV
heads, intermediate 1536, vocab 8192; random weights, seed 0), 32 prompts of 64 + 4i distinct random
tokens, 128 greedy new tokens each with no EOS stop, 2 threads everywhere, prefix caching off.
--size 0.5b: a Qwen2.5-0.5B-shaped llama (hidden 896, 24 layers, 14 heads / 2 KV, intermediate 4864,
vocab 32000), 16 prompts, 64 tokens, 2 single; --size 1.5b: Qwen2.5-1.5B-shaped (hidden 1536, 28
layers, 12 / 2, intermediate 8960, vocab 151936, tied), 16 prompts, 32 tokens, 2 single; --size 3b: Llama-3.2-3B-shaped
(3072, 28, 24 / 8, 8192, vocab 128256, tied) and --size 7b: Qwen2.5-7B-shaped (3584, 28, 28 / 4, 18944, vocab
152064), 8 prompts, 16 tokens, 1 single. From 1.5b up the source is written as real checkpoints are: bf16
safetensors in shards of at most 4 GiB (benchmarks/export_memory.py's build_source, llama architecture so that every
peer's converter takes it), and the rows are bf16 beside fp32 (1.5b only: 7B at fp32 is 28 GiB), int8 and int4; at
7b transformers' fp32 reference does not fit, so greedy agreement is not computed there. Single mode runs a
512-token prompt first, on its own, for the "TTFT 512-token prompt" column. The conversion columns are each
engine's conversion of the model (export, quantization, verification): its wall time and its peak RSS (the
conversion runs in a forked child: wait4's ru_maxrss, its own children included), measured when it ran and cached;
the load column is the time from opening the converted model to being ready to generate; the package column is the
bytes of what the conversion made (ortinf's package folder, llama.cpp's GGUF file);
the roofline column is a single-request step's weight bytes over the machine's measured streaming
bandwidth (benchmarks/bandwidth.py's probe: its best read loop, 2 threads, measured after the rows), divided by the step's time.

Each row runs in a fresh process of its engine's own environment (benchmarks/peers/run_*.py; the
peers are installed by benchmarks/peers/install_*.sh and are benchmark dependencies only), one after
another; --passes N repeats the whole round N times, interleaved, and reports each row's median
pass (by throughput). A peer whose environment is missing is reported as "not installed".

Reported per row: output tokens/s (all output tokens / wall time of the timed run), mean TTFT, mean
TPOT, and greedy agreement: prompts whose 128 tokens equal transformers' own greedy tokens (computed
once, one prompt at a time, unpadded). "batch" rows submit all 32 prompts at once; "single" rows run
4 prompts one after another. Ratios: ortinf over the best peer at each precision, and the int8/int4
rows over the best fp32 peer. ortinf runs its CPU kernel library's graph (model.cpu.onnx: ortinf.PagedAttention, and ortinf.QMatMul
for int8/int4) where the library is built; the "portable kernel" and "MatMulNBits graph" rows are the
same packages on the portable graph (model.onnx), for the before/after in the same run. --tiny: a 2-layer model, 4 prompts,
8 tokens, ortinf and transformers
rows only (the smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "benchmarks" / "peers"
sys.path.insert(0, str(ROOT / "benchmarks"))

from ortinf.matrix import machine  # noqa: E402

NUM_PROMPTS, NEW_TOKENS, THREADS = 32, 128, 2
SINGLE = slice(14, 18)  # the single-stream rows' prompts


@dataclass(frozen=True)
class Size:
    """A benchmark model shape (a llama with random weights) and the workload scaled so that one pass
    of every engine fits in ~30 minutes on 2 cores (~1 hour at 7B)."""

    label: str
    config: dict
    num_prompts: int
    new_tokens: int
    single: slice
    precisions: tuple[str, ...] = ("fp32", "int8", "int4")
    source: str = ""  # export_memory.py's shape key: a bf16 checkpoint in shards, as real ones come ("": fp32, one file)
    reference: bool = True  # transformers' fp32 greedy tokens (a 7B model at fp32 does not fit in 24 GiB)
    # the same-package before/after rows (ortinf's portable and MatMulNBits graphs, OpenVINO's fp32 IR at its default
    # precision): at the small sizes only, where a pass is minutes (from 1.5B the bf16 rows show the plugin's default)
    before_after: bool = True


def _shape(key: str) -> dict:
    from export_memory import SHAPES

    config = dict(SHAPES[key][1])
    config.pop("tie_word_embeddings", None)
    return config


SIZES = {
    "toy": Size("33.6M llama", dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                      num_attention_heads=8, num_key_value_heads=4), 32, 128, slice(14, 18)),
    "0.5b": Size("Qwen2.5-0.5B-shaped llama", dict(vocab_size=32000, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                                   num_attention_heads=14, num_key_value_heads=2), 16, 64, slice(7, 9)),
    "1.5b": Size("Qwen2.5-1.5B-shaped llama (bf16 checkpoint)", _shape("1.5b"), 16, 32, slice(7, 9),
                 ("fp32", "bf16", "int8", "int4"), "1.5b", before_after=False),
    "3b": Size("Llama-3.2-3B-shaped llama (bf16 checkpoint)", _shape("3b"), 8, 16, slice(3, 4), ("bf16", "int8", "int4"), "3b", before_after=False),
    "7b": Size("Qwen2.5-7B-shaped llama (bf16 checkpoint)", _shape("7b"), 8, 16, slice(3, 4), ("bf16", "int8", "int4"), "7b",
               reference=False, before_after=False),
}
BYTES_PER_WEIGHT = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0 + 4 / 128, "int4": 0.5 + 4 / 32}  # ortinf's default blocks, scales included
LONG_PROMPT = 512  # tokens of the single-mode TTFT prompt


def weight_bytes_per_token(config: dict, precision: str) -> float:
    """Bytes of weights one decode step reads: every layer's projections and the LM head (the embedding
    row read is negligible), at the precision's storage size."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim = h // config["num_attention_heads"]
    per_layer = h * h * 2 + 2 * h * config["num_key_value_heads"] * head_dim + 3 * h * inter
    return (layers * per_layer + config["vocab_size"] * h) * BYTES_PER_WEIGHT.get(precision, 4.0)


@dataclass(frozen=True)
class Engine:
    name: str  # as printed
    runner: str  # benchmarks/peers/run_<runner>.py
    venv: str  # environment that runs it
    precision: str  # the precision column: fp32 / int8 / int4 (the job's precision may be the engine's own name)
    job_precision: str
    extra: tuple[tuple[str, object], ...] = ()  # more job fields

    def job(self, **fields) -> dict:
        return {"engine": self.runner, "precision": self.job_precision, **dict(self.extra), **fields}


ENGINES = [
    Engine("ortinf", "ortinf", ".venv", "fp32", "fp32"),
    Engine("ortinf, portable kernel", "ortinf", ".venv", "fp32", "fp32", (("options", {"cpu_kernel": False}),)),
    Engine("ortinf", "ortinf", ".venv", "bf16", "bf16"),
    Engine("ortinf", "ortinf", ".venv", "int8", "int8"),
    Engine("ortinf", "ortinf", ".venv", "int4", "int4"),
    # the same int8/int4 packages on their portable graph (ORT's MatMulNBits, accuracy level 4) instead of
    # the kernel library's graph (ortinf.QMatMul): the before/after of the quantized GEMMs in one run
    Engine("ortinf, MatMulNBits graph", "ortinf", ".venv", "int8", "int8", (("options", {"cpu_kernel": False}),)),
    Engine("ortinf, MatMulNBits graph", "ortinf", ".venv", "int4", "int4", (("options", {"cpu_kernel": False}),)),
    Engine("transformers generate (padded batch)", "hf", ".venv", "fp32", "fp32", (("engine", "transformers"),)),
    Engine("Optimum ORTModelForCausalLM (padded batch)", "hf", ".venv", "fp32", "fp32", (("engine", "optimum"),)),
    Engine("onnxruntime-genai Generator (padded batch)", "genai", ".venv-bench-genai", "fp32", "fp32"),
    Engine("onnxruntime-genai Generator (padded batch)", "genai", ".venv-bench-genai", "int8", "int8"),
    Engine("onnxruntime-genai Generator (padded batch)", "genai", ".venv-bench-genai", "int4", "int4"),
    Engine("llama.cpp (llama_decode, f16 KV, flash attn)", "llama_cpp", ".venv-bench-llamacpp", "fp32", "fp32"),
    Engine("llama.cpp (llama_decode, f16 KV, flash attn)", "llama_cpp", ".venv-bench-llamacpp", "bf16", "bf16"),
    Engine("llama.cpp (llama_decode, f16 KV, flash attn)", "llama_cpp", ".venv-bench-llamacpp", "int8", "q8_0"),
    Engine("llama.cpp (llama_decode, f16 KV, flash attn)", "llama_cpp", ".venv-bench-llamacpp", "int4", "q4_0"),
    Engine("OpenVINO GenAI ContinuousBatchingPipeline", "openvino_genai", ".venv-bench-ovgenai", "fp32", "fp32"),
    Engine("OpenVINO GenAI ContinuousBatchingPipeline", "openvino_genai", ".venv-bench-ovgenai", "fp32", "default"),
    Engine("OpenVINO GenAI ContinuousBatchingPipeline, fp16 IR", "openvino_genai", ".venv-bench-ovgenai", "bf16", "bf16"),
    Engine("OpenVINO GenAI ContinuousBatchingPipeline", "openvino_genai", ".venv-bench-ovgenai", "int8", "int8"),
    Engine("OpenVINO GenAI ContinuousBatchingPipeline", "openvino_genai", ".venv-bench-ovgenai", "int4", "int4"),
]
PRECISION_LABEL = {"q8_0": "Q8_0", "q4_0": "Q4_0", "default": "weights; plugin's default KV/inference precision"}
# onnxruntime-genai has no bf16 row: ONNX Runtime's CPU provider has no bf16 MatMul (its builder's bf16 targets CUDA)


@dataclass
class Row:
    engine: Engine
    mode: str
    result: dict | None
    error: str = ""

    @property
    def throughput(self) -> float:
        return sum(len(t) for t in self.result["tokens"]) / self.result["seconds"] if self.result else 0.0

    def agreement(self, reference: list[list[int]]) -> int:
        return sum(t == r for t, r in zip(self.result["tokens"], reference))


TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def build_model(hf_dir: Path, tiny: bool = False, size: str = "toy") -> None:
    """The benchmark llama, plus a placeholder word-level tokenizer: the peers' converters insist on
    one; the benchmark feeds token ids, so its pieces never matter."""
    if (hf_dir / "config.json").exists():
        return
    if not tiny and SIZES[size].source:
        from export_memory import build_source

        build_source(hf_dir, SIZES[size].source, model_type="llama")
        return
    from export_llama import build
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    config = TINY if tiny else SIZES[size].config
    build(hf_dir, **config, max_position_embeddings=4096)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, config["vocab_size"])}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>").save_pretrained(hf_dir)


def prompts(vocab: int = 8192) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(3, vocab, 64 + 4 * i).tolist() for i in range(NUM_PROMPTS)]


def _before_after(engine: Engine) -> bool:
    return engine.job_precision == "default" or (engine.runner == "ortinf" and bool(engine.extra))


def long_prompt(vocab: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(1).integers(3, vocab, LONG_PROMPT).tolist()


def run(engine: Engine, mode: str, work: Path, hf_dir: Path, prompt_set: list[list[int]], timeout: float,
        new_tokens: int | None = None, long: list[int] | None = None) -> Row:
    python = ROOT / engine.venv / "bin" / "python"
    if not python.exists():
        return Row(engine, mode, None, f"not installed (bash benchmarks/peers/install_{engine.runner}.sh)")
    job = engine.job(hf_dir=str(hf_dir), work_dir=str(work / engine.runner), prompts=prompt_set, new_tokens=new_tokens or NEW_TOKENS,
                     threads=THREADS, mode=mode, long_prompt=long if mode == "single" else None)
    job_file, result_file = work / "job.json", work / "result.json"
    job_file.write_text(json.dumps(job))
    result_file.unlink(missing_ok=True)
    # PYTHONPATH kept behind the peers' folder: a run from a git worktree imports that tree's ortinf
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": os.pathsep.join(filter(None, [str(PEERS), os.environ.get("PYTHONPATH")]))}
    try:
        proc = subprocess.run([str(python), str(PEERS / f"run_{engine.runner}.py"), str(job_file), str(result_file)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Row(engine, mode, None, f"timed out after {timeout:.0f} s")
    if proc.returncode != 0 or not result_file.exists():
        lines = proc.stderr.strip().splitlines() or ["no output"]
        last = next((line for line in reversed(lines) if "conversion killed" in line), lines[-1])
        if proc.returncode < 0:
            last = f"killed by signal {-proc.returncode} (9: out of memory); {last}"
        (work / f"{engine.runner}-{engine.job_precision}-{mode}.stderr").write_text(proc.stderr)
        return Row(engine, mode, None, f"failed: {last[:200]}")
    return Row(engine, mode, json.loads(result_file.read_text()))


def reference_tokens(work: Path, hf_dir: Path, prompt_set: list[list[int]]) -> list[list[int]]:
    """transformers' greedy tokens, one prompt at a time (no padding), cached in the work folder."""
    cache = work / "reference.json"
    if not cache.exists():
        engine = Engine("transformers", "hf", ".venv", "fp32", "fp32", (("engine", "transformers"),))
        row = run(engine, "single", work, hf_dir, prompt_set, timeout=1800)
        assert row.result, row.error
        cache.write_text(json.dumps(row.result["tokens"]))
    return json.loads(cache.read_text())


def table(rows: list[Row], reference: list[list[int]] | None, config: dict, bandwidth: float) -> list[str]:
    lines = ["| engine | precision | requests | output tok/s | mean TTFT ms | TTFT 512-token prompt ms | mean TPOT ms | TPOT roofline "
             "| greedy = transformers | conversion s | conversion peak GiB | load s | package GB |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]

    def number(value: float | None, scale: float = 1.0, digits: int = 0) -> str:
        return "" if value is None else f"{value * scale:,.{digits}f}"

    for row in rows:
        e = row.engine
        label = f"{e.precision} ({PRECISION_LABEL[e.job_precision]})" if e.job_precision in PRECISION_LABEL else e.precision
        requests = f"{NUM_PROMPTS} at once" if row.mode == "batch" else f"{SINGLE.stop - SINGLE.start} one at a time"
        if row.result is None:
            lines.append(f"| {e.name} | {label} | {requests} | {row.error} | | | | | | | | | |")
            continue
        r = row.result
        tpot = statistics.mean(r["tpot"])
        # the single-request step as a fraction of the bandwidth roofline: weight bytes per token / bandwidth
        roof = f"{weight_bytes_per_token(config, e.precision) / bandwidth / tpot:.0%}" if row.mode == "single" and bandwidth else ""
        if reference is None:
            agree = "not computed"
        else:
            ref = reference if row.mode == "batch" else reference[SINGLE]
            agree = f"{row.agreement(ref)}/{len(ref)}"
        lines.append(f"| {e.name} | {label} | {requests} | {row.throughput:,.1f} | {statistics.mean(r['ttft']) * 1e3:,.0f} | "
                     f"{number(r.get('ttft_long'), 1e3)} | {tpot * 1e3:.1f} | {roof} | {agree} | {number(r.get('conversion_seconds'))} | "
                     f"{number(r.get('conversion_peak_gib'), digits=2)} | {number(r.get('load_seconds'), digits=2)} | "
                     f"{number(r.get('package_bytes'), 1e-9, 2)} |")
    return lines


def ratios(rows: list[Row]) -> list[str]:
    done = [r for r in rows if r.result]
    best = {}
    # a peer's own default precision (OpenVINO's bf16 compute and 8-bit KV under fp32 weights) is not
    # an exact-fp32 peer: it gets its own ratio line, not the fp32 target's
    defaults = [r for r in done if r.engine.job_precision == "default" and r.mode == "batch"]
    for row in done:
        if row.engine.runner != "ortinf" and row.engine.job_precision != "default":
            key = (row.mode, row.engine.precision)
            if key not in best or row.throughput > best[key].throughput:
                best[key] = row
    lines = []
    for row in (r for r in done if r.engine.runner == "ortinf" and r.mode == "batch"):
        p = row.engine.precision
        parts = []
        if ("batch", p) in best:
            peer = best[("batch", p)]
            parts.append(f"{row.throughput / peer.throughput:.2f}x the best {p} peer ({peer.engine.name}, {peer.throughput:,.0f} tok/s; target 1.1x)")
        if p != "fp32" and ("batch", "fp32") in best:
            peer = best[("batch", "fp32")]
            parts.append(f"{row.throughput / peer.throughput:.2f}x the best fp32 peer")
        parts += [f"{row.throughput / d.throughput:.2f}x {d.engine.name} at its default precision" for d in defaults]
        if parts:
            lines.append(f"- {row.engine.name} {p}, {NUM_PROMPTS} at once: " + "; ".join(parts))
    singles = [r for r in done if r.mode == "single"]
    if singles:
        tpot = [(r.engine, statistics.mean(r.result["tpot"]) * 1e3) for r in singles]  # (Engine holds dicts: unhashable)
        for engine, ms in tpot:
            if engine.runner == "ortinf":
                p = engine.precision
                peers = [(k, v) for k, v in tpot if k.runner != "ortinf" and k.precision == p and k.job_precision != "default"]
                if peers:
                    k, v = min(peers, key=lambda kv: kv[1])
                    line = f"- single-request TPOT {p}: {engine.name} {ms:.1f} ms vs best peer {v:.1f} ms ({k.name}; target: no worse)"
                    longs = [(r.engine.name, r.result.get("ttft_long")) for r in singles if r.engine.precision == p]
                    ours = next((t for name, t in longs if name == engine.name and t is not None), None)
                    theirs = [(t, name) for name, t in longs if t is not None and not name.startswith("ortinf")]
                    if ours is not None and theirs:
                        t, name = min(theirs)
                        line += (f"; TTFT of the {LONG_PROMPT}-token prompt {ours * 1e3:,.0f} ms vs best peer {t * 1e3:,.0f} ms "
                                 f"({name}; target: no worse)")
                    line += "".join(f"; {d.name} at its default precision {t:.1f} ms" for d, t in tpot
                                    if d.job_precision == "default" and p == "fp32")
                    lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=1, help="interleaved rounds over all rows; each row reports its median pass")
    parser.add_argument("--only", nargs="*", default=None, help="runner names to include (ortinf hf genai llama_cpp openvino_genai)")
    parser.add_argument("--precisions", nargs="*", default=None,
                        help="precisions to include (fp32 bf16 int8 int4; default: those the size lists: 7B's fp32 does not fit in 24 GiB)")
    parser.add_argument("--modes", nargs="*", default=["batch", "single"], help="batch (32 at once) and/or single (one at a time)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/ortinf-compare"), help="converted models and caches (kept between runs)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds allowed to one row, conversion included")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--tiny", action="store_true", help="2-layer model, 4 prompts x 8 tokens, ortinf and transformers only (smoke test)")
    parser.add_argument("--size", choices=sorted(SIZES), default="toy",
                        help="model shape: toy (33.6M), 0.5b (Qwen2.5-0.5B-shaped), 1.5b (Qwen2.5-1.5B), 3b (Llama-3.2-3B), 7b "
                             "(Qwen2.5-7B); 1.5b-7b are bf16 checkpoints in shards under the work dir; the workload scales with it")
    args = parser.parse_args()
    global NUM_PROMPTS, NEW_TOKENS, SINGLE
    size = SIZES[args.size]
    NUM_PROMPTS, NEW_TOKENS, SINGLE = size.num_prompts, size.new_tokens, size.single
    if args.size != "toy":
        args.work_dir = args.work_dir.with_name(f"{args.work_dir.name}-{args.size}")
    if args.tiny:
        NUM_PROMPTS, NEW_TOKENS, SINGLE = 4, 8, slice(1, 2)
        args.only = [name for name in (args.only or ["ortinf", "hf"]) if name in ("ortinf", "hf")]
        args.work_dir = args.work_dir.with_name(args.work_dir.name + "-tiny")
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    hf_dir = work / "hf"
    build_model(hf_dir, args.tiny, args.size)
    config = TINY if args.tiny else size.config
    prompt_set = prompts(config["vocab_size"])
    reference = reference_tokens(work, hf_dir, prompt_set) if args.tiny or size.reference else None
    long = long_prompt(config["vocab_size"])
    precisions = ("fp32", "int8", "int4") if args.tiny else size.precisions
    engines = [e for e in ENGINES if (args.only is None or e.runner in args.only) and e.precision in (args.precisions or precisions)
               and (size.reference or e.runner != "hf") and (size.before_after or not _before_after(e))]
    passes: dict[tuple[int, str], list[Row]] = {}
    for number in range(args.passes):
        for index, engine in enumerate(engines):
            for mode in args.modes:
                if engine.runner == "hf" and engine.extra == (("engine", "transformers"),) and mode == "single":
                    continue  # the reference run is that row
                started = time.monotonic()
                row = run(engine, mode, work, hf_dir, prompt_set if mode == "batch" else prompt_set[SINGLE], args.timeout, long=long)
                print(f"pass {number + 1}: {engine.name} {engine.job_precision} {mode}: "
                      f"{f'{row.throughput:,.0f} tok/s' if row.result else row.error} ({time.monotonic() - started:.0f} s)", flush=True)
                passes.setdefault((index, mode), []).append(row)
    rows = []
    for key in sorted(passes, key=lambda k: (k[1] != "batch", k[0])):
        runs = sorted(passes[key], key=lambda r: r.throughput)
        rows.append(runs[len(runs) // 2])
    from bandwidth import measure

    bandwidth = measure(THREADS, *((16, 1) if args.tiny else (1024, 3)))
    head = (f"### Side by side: {'tiny 2-layer llama' if args.tiny else size.label}, {NUM_PROMPTS} prompts of 64+4i tokens, "
            f"{NEW_TOKENS} greedy tokens each (single mode: a {LONG_PROMPT}-token prompt first, for its TTFT), {THREADS} threads, "
            f"median of {args.passes} interleaved pass(es) ({time.strftime('%Y-%m-%d')})")
    probe = f"memory bandwidth {bandwidth / 1e9:.1f} GB/s (benchmarks/bandwidth.py's best read loop, {THREADS} threads)"
    text = "\n".join([head, "", f"Machine: {machine()}; {probe}",
                      "", *table(rows, reference, config, bandwidth), "", *ratios(rows), ""])
    print(text)
    if args.record:
        with (ROOT / "benchmarks" / "RESULTS.md").open("a", encoding="utf-8") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
