"""llama.cpp through llama-cpp-python's low-level API: one context, all sequences in llama_decode.

Conversion: the Hugging Face llama, qwen3 or qwen3_moe is written to GGUF (F32; BF16 from a bf16 checkpoint for
the bf16, Q8_0 and Q4_0 rows) with the `gguf` package, one tensor at a time from the memory-mapped shards, as
llama.cpp's convert_hf_to_gguf.py writes them (llama: q/k rows permuted to GGML's rotary
layout; qwen3: NEOX rotary, so no permutation, and q/k norms; qwen3_moe: the router as ffn_gate_inp
and each layer's experts stacked into ffn_{gate,up,down}_exps [experts, ...]; a byte-fallback
SentencePiece vocabulary of placeholder pieces, since the benchmark feeds token ids and the random
model has no tokenizer), then quantized to Q8_0 / Q4_0 by llama.cpp's own llama_model_quantize.
Batch mode: every prompt is prefilled in llama_decode calls of up to n_batch tokens spanning several
sequences, then one llama_decode per step carries one token of each of the 32 sequences (f16 KV,
flash attention on, as the llama.cpp server runs; job "kv": "f32" keeps the KV cache in f32).
Greedy is argmax over the returned logits. Its F32 tokens are not transformers' exactly even with an
f32 KV cache (first differences at tokens 49 and 61 of 64 on two of six prompts, the same with f16
KV): ggml's own kernels round differently, the conversion itself matches.
"""

from __future__ import annotations

import ctypes
import json
import time
from pathlib import Path

import numpy as np
from protocol import conversion, load_job, loading, one_at_a_time, write_result

FILE_TYPES = {"fp32": 0, "bf16": 32, "q8_0": 7, "q4_0": 2}  # llama_ftype: ALL_F32, MOSTLY_BF16, MOSTLY_Q8_0, MOSTLY_Q4_0


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half q/k rows to GGML's interleaved-pair rotary layout (convert_hf_to_gguf's permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class Shards:
    """A checkpoint's tensors read lazily from its safetensors files (one or an index of shards), memory-mapped:
    numpy has no bf16, so bf16 tensors come as their uint16 bits (what a BF16 GGUF stores)."""

    DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}

    def __init__(self, hf_dir: Path) -> None:
        index = hf_dir / "model.safetensors.index.json"
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
        self.where: dict[str, tuple[Path, dict, int]] = {}
        for file in files:
            with open(hf_dir / file, "rb") as fh:
                length = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(length))
            for name, info in header.items():
                if name != "__metadata__":
                    self.where[name] = (hf_dir / file, info, 8 + length)

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def dtype(self, name: str) -> str:
        return self.where[name][1]["dtype"]

    def raw(self, name: str) -> np.ndarray:
        path, info, base = self.where[name]
        begin, end = info["data_offsets"]
        dtype = self.DTYPES[info["dtype"]]
        return np.memmap(path, dtype=dtype, mode="r", offset=base + begin, shape=(end - begin) // np.dtype(dtype).itemsize).reshape(info["shape"])

    def f32(self, name: str) -> np.ndarray:
        values = self.raw(name)
        if self.dtype(name) == "BF16":
            return (values.astype(np.uint32) << 16).view(np.float32)
        return values.astype(np.float32)


def write_gguf(hf_dir: Path, out: Path, bf16: bool = False) -> None:
    """The model as a GGUF file, one tensor at a time (header and tensor table first, then each tensor read from its
    shard, converted and written: convert_hf_to_gguf.py's lazy tensors, so memory holds one tensor): F32, or with
    `bf16` the matrices in BF16 (a bf16 checkpoint's bits, as `convert_hf_to_gguf.py --outtype bf16` writes them) and
    the norms in F32 (ggml computes norms in f32)."""
    import gguf

    cfg = json.loads((hf_dir / "config.json").read_text())
    shards = Shards(hf_dir)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    model_type = cfg.get("model_type", "llama")
    arch = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3moe"}[model_type]
    writer = gguf.GGUFWriter(str(out), arch)
    if model_type == "qwen3_moe":
        writer.add_expert_count(cfg["num_experts"])
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_file_type(32 if bf16 else 0)  # LLAMA_FTYPE_MOSTLY_BF16 / ALL_F32
    vocab = cfg["vocab_size"]
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [f"\u2581t{i}" for i in range(vocab - len(pieces))]
    kinds = [2, 3, 3] + [6] * 256 + [1] * (vocab - 259)  # UNKNOWN, CONTROL, BYTE, NORMAL
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types(kinds)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    if model_type == "qwen3_moe":
        names["mlp.gate"] = "ffn_gate_inp"
    else:
        names.update({"mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"})
    if model_type != "llama":
        names.update({"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"})

    def read(name: str, rows_of: int = 0) -> tuple[list[int], bool, object]:
        """(shape, stored as BF16, a callable giving the tensor when its turn comes)."""
        shape = shards.where[name][1]["shape"]
        raw = bf16 and len(shape) > 1 and shards.dtype(name) == "BF16"

        def tensor() -> np.ndarray:
            w = shards.raw(name) if raw else shards.f32(name)
            return np.ascontiguousarray(permute(w, rows_of) if rows_of else w)
        return shape, raw, tensor

    plan = [("token_embd.weight", read("model.embed_tokens.weight"))]
    for layer in range(cfg["num_hidden_layers"]):
        for hf, gg in names.items():
            rows_of = heads if hf == "self_attn.q_proj" else kv_heads if hf == "self_attn.k_proj" else 0
            plan.append((f"blk.{layer}.{gg}.weight", read(f"model.layers.{layer}.{hf}.weight", rows_of if model_type == "llama" else 0)))
        if model_type == "qwen3_moe":
            for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                experts = [read(f"model.layers.{layer}.mlp.experts.{e}.{hf}.weight") for e in range(cfg["num_experts"])]
                shape, raw, _ = experts[0]
                plan.append((f"blk.{layer}.{gg}.weight",
                             ([len(experts), *shape], raw, lambda experts=experts: np.stack([e[2]() for e in experts]))))
    plan.append(("output_norm.weight", read("model.norm.weight")))
    plan.append(("output.weight", read("lm_head.weight" if "lm_head.weight" in shards else "model.embed_tokens.weight")))
    for name, (shape, raw, _) in plan:
        count = int(np.prod(shape))
        writer.add_tensor_info(name, shape, np.dtype(np.float16 if raw else np.float32), count * (2 if raw else 4),
                               raw_dtype=gguf.GGMLQuantizationType.BF16 if raw else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, (_, _, make) in plan:
        writer.write_tensor_data(make())
    writer.close()


def model_file(job: dict, llama) -> Path:
    """The GGUF file of the job's precision: the checkpoint written as F32 (fp32), or as BF16 where the checkpoint is
    bf16 (bf16, and the base that Q8_0/Q4_0 are quantized from, as llama.cpp users convert then quantize)."""
    work = Path(job["work_dir"])
    work.mkdir(parents=True, exist_ok=True)
    hf_dir = Path(job["hf_dir"])
    kind = "bf16" if job["precision"] != "fp32" and Shards(hf_dir).dtype("model.embed_tokens.weight") == "BF16" else "f32"
    base = work / f"model-{kind}.gguf"
    to_gguf = conversion(work / f"model-{kind}.conversion_seconds", not base.exists(), lambda: write_gguf(hf_dir, base, kind == "bf16"), job)
    job["conversion_seconds"] = to_gguf
    if job["precision"] in ("fp32", "bf16"):
        if job["precision"] == "bf16" and kind != "bf16":
            raise SystemExit("bf16 needs a bf16 checkpoint")
        return base
    out = work / f"model-{job['precision']}.gguf"

    def quantize() -> None:
        params = llama.llama_model_quantize_default_params()
        params.ftype = FILE_TYPES[job["precision"]]
        params.nthread = job["threads"]
        assert llama.llama_model_quantize(str(base).encode(), str(out).encode(), ctypes.byref(params)) == 0

    quantized = conversion(work / f"model-{job['precision']}.conversion_seconds", not out.exists(), quantize, job)
    job["conversion_seconds"] = None if to_gguf is None or quantized is None else to_gguf + quantized  # GGUF, then quantize
    return out


class Runner:
    def __init__(self, llama, path: Path, threads: int, seqs: int, ctx_per_seq: int, kv_f32: bool) -> None:
        self.llama = llama
        mparams = llama.llama_model_default_params()
        mparams.use_extra_bufts = False  # no AMX repacking: where the kernel does not grant AMX tile state it is an illegal instruction
        self.model = llama.llama_model_load_from_file(str(path).encode(), mparams)
        cparams = llama.llama_context_default_params()
        cparams.n_ctx = seqs * ctx_per_seq
        cparams.n_batch = 2048
        cparams.n_ubatch = 512
        cparams.n_seq_max = seqs
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cparams.kv_unified = True
        if kv_f32:
            cparams.type_k = cparams.type_v = llama.GGML_TYPE_F32
        self.ctx = llama.llama_init_from_model(self.model, cparams)
        self.vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(self.model))
        self.batch = llama.llama_batch_init(2048, 0, 1)

    def decode(self, items: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """items of (token, position, sequence, wants logits); returns the logits rows asked for."""
        b = self.batch
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(items)
        assert self.llama.llama_decode(self.ctx, b) == 0
        rows = sum(1 for it in items if it[3])
        ptr = self.llama.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.vocab))

    def generate(self, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], list[float], list[float]]:
        """All prompts at once; returns tokens and each sequence's first/last token times."""
        self.llama.llama_memory_clear(self.llama.llama_get_memory(self.ctx), True)
        items = [(tok, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, tok in enumerate(p)]
        out: list[list[int]] = [[] for _ in prompts]
        first = [0.0] * len(prompts)
        for start in range(0, len(items), 2048):
            chunk = items[start : start + 2048]
            logits = self.decode(chunk)
            ends = [seq for (_, _, seq, last) in chunk if last]
            now = time.monotonic()
            for row, seq in enumerate(ends):
                out[seq].append(int(np.argmax(logits[row])))
                first[seq] = now
        for _ in range(new_tokens - 1):
            logits = self.decode([(out[s][-1], len(p) + len(out[s]) - 1, s, True) for s, p in enumerate(prompts)])
            for s in range(len(prompts)):
                out[s].append(int(np.argmax(logits[s])))
        last = time.monotonic()
        return out, first, [last] * len(prompts)


def main() -> None:
    import llama_cpp as llama

    job = load_job()
    llama.llama_backend_init()
    path = model_file(job, llama)
    job["package_bytes"] = path.stat().st_size
    prompts, new = job["prompts"], job["new_tokens"]
    longest = max(len(p) for p in prompts) + new
    seqs = len(prompts) if job["mode"] == "batch" else 1
    longest = max(longest, len(job.get("long_prompt") or []) + new)
    runner = loading(job, lambda: Runner(llama, path, job["threads"], seqs, -(-longest // 256) * 256, job.get("kv") == "f32"))
    runner.generate(prompts[:seqs][:2], 4)  # warm-up
    if job["mode"] == "batch":
        start = time.monotonic()
        tokens, first, last = runner.generate(prompts, new)
        seconds = time.monotonic() - start
        ttft = [f - start for f in first]
        tpot = [(b - a) / (new - 1) for a, b in zip(first, last)]
    else:
        def one(prompt):
            toks, first, last = runner.generate([prompt], new)
            return toks[0], first[0], last[0]
        tokens, seconds, ttft, tpot = one_at_a_time(job, one)
    write_result(job, "llama.cpp", tokens, seconds, ttft, tpot, version=llama.__version__)


if __name__ == "__main__":
    main()
