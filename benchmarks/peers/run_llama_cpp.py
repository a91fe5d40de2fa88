"""llama.cpp through llama-cpp-python's low-level API: one context, all sequences in llama_decode.

Conversion: the Hugging Face llama, qwen3 or qwen3_moe is written to GGUF (F32) with the `gguf`
package, as llama.cpp's convert_hf_to_gguf.py writes them (llama: q/k rows permuted to GGML's rotary
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
from protocol import conversion, load_job, one_at_a_time, write_result

FILE_TYPES = {"fp32": 0, "q8_0": 7, "q4_0": 2}  # llama_ftype: ALL_F32, MOSTLY_Q8_0, MOSTLY_Q4_0


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half q/k rows to GGML's interleaved-pair rotary layout (convert_hf_to_gguf's permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf_dir: Path, out: Path) -> None:
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    weights = {name: w.astype(np.float32) for name, w in load_file(str(hf_dir / "model.safetensors")).items()}  # F32 file (fp16 norms abort ggml)
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
    writer.add_file_type(0)
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
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for layer in range(cfg["num_hidden_layers"]):
        for hf, gg in names.items():
            w = weights[f"model.layers.{layer}.{hf}.weight"]
            if model_type == "llama" and hf == "self_attn.q_proj":
                w = permute(w, heads)
            elif model_type == "llama" and hf == "self_attn.k_proj":
                w = permute(w, kv_heads)
            writer.add_tensor(f"blk.{layer}.{gg}.weight", np.ascontiguousarray(w))
        if model_type == "qwen3_moe":
            for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                stacked = np.stack([weights[f"model.layers.{layer}.mlp.experts.{e}.{hf}.weight"] for e in range(cfg["num_experts"])])
                writer.add_tensor(f"blk.{layer}.{gg}.weight", stacked)
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    lm_head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    writer.add_tensor("output.weight", lm_head)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def model_file(job: dict, llama) -> Path:
    work = Path(job["work_dir"])
    work.mkdir(parents=True, exist_ok=True)
    f32 = work / "model-f32.gguf"
    to_gguf = conversion(work / "model-f32.conversion_seconds", not f32.exists(), lambda: write_gguf(Path(job["hf_dir"]), f32))
    job["conversion_seconds"] = to_gguf
    if job["precision"] == "fp32":
        return f32
    out = work / f"model-{job['precision']}.gguf"

    def quantize() -> None:
        params = llama.llama_model_quantize_default_params()
        params.ftype = FILE_TYPES[job["precision"]]
        params.nthread = job["threads"]
        assert llama.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params)) == 0

    quantized = conversion(work / f"model-{job['precision']}.conversion_seconds", not out.exists(), quantize)
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
    prompts, new = job["prompts"], job["new_tokens"]
    longest = max(len(p) for p in prompts) + new
    seqs = len(prompts) if job["mode"] == "batch" else 1
    runner = Runner(llama, path, job["threads"], seqs, -(-longest // 256) * 256, job.get("kv") == "f32")
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
