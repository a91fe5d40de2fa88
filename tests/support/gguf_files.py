"""Writing GGUF files from tiny Hugging Face models (what llama.cpp's convert_hf_to_gguf.py does, for the Qwen2
architecture the tests use): the tests' stand-in for a llama.cpp or Ollama user's model file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_gguf(hf_folder: Path, path: Path, quantization: str = "F32") -> Path:
    """A GGUF of the Qwen2 model in `hf_folder` (its byte-level BPE tokenizer as tokens and merges), weights as
    F32, F16, Q8_0 or Q4_0 (the 2-D matrices; norms, biases stay F32, as llama.cpp keeps them), or Q4_K_M's mix
    (Q6_K for attn_v and ffn_down, Q4_K for the others; the gguf package cannot quantize to K-quants, so these
    blocks are random bits with sane fp16 scales: the file's model is its own, not hf_folder's)."""
    import gguf

    config = json.loads((hf_folder / "config.json").read_text())
    assert config["model_type"] == "qwen2", "write_gguf knows the Qwen2 layout only"
    state = _safetensors(hf_folder)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2, "Q4_K_M": 15}[quantization])
    tokenizer = json.loads((hf_folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokens = [None] * config["vocab_size"]
    for token, index in vocab.items():
        tokens[index] = token
    for added in tokenizer.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
    # free slots (a vocabulary larger than the tokenizer's) hold the special tokens transformers' Qwen2 converter adds,
    # as a real Qwen2 GGUF's vocabulary does
    specials = iter(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tokens = [t if t is not None else next(specials, f"[PAD{i}]") for i, t in enumerate(tokens)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t.startswith("<") and t.endswith(">") else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config.get("bos_token_id", 1))
    writer.add_eos_token_id(config.get("eos_token_id", 2))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, config["num_hidden_layers"])
    kind = getattr(gguf.GGMLQuantizationType, quantization, None)
    rng = np.random.default_rng(0)
    for name, value in state.items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        if quantization == "Q4_K_M" and value.ndim == 2 and value.shape[1] % 256 == 0 and not target.startswith("token_embd"):
            kquant = "Q6_K" if target.endswith(("attn_v", "ffn_down")) else "Q4_K"
            writer.add_tensor(target, _random_kquant(rng, value.shape, kquant), raw_dtype=getattr(gguf.GGMLQuantizationType, kquant))
        elif value.ndim == 2 and quantization not in ("F32", "Q4_K_M") and value.shape[1] % 32 == 0:
            data = gguf.quantize(value.astype(np.float32), kind) if quantization != "F16" else value.astype(np.float16)
            writer.add_tensor(target, data, raw_shape=data.shape if quantization == "F16" else None,
                              raw_dtype=None if quantization == "F16" else kind)
        else:
            writer.add_tensor(target, value.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _random_kquant(rng: np.random.Generator, shape: tuple[int, int], kind: str) -> np.ndarray:
    """Random K-quant blocks (256 weights each) for a [rows, cols] matrix, their fp16 super-block scales set so that the
    weights stay within about +-0.1 (Q4_K: d, dmin first of 144 bytes; Q6_K: d last of 210 bytes)."""
    rows, cols = shape
    size = {"Q4_K": 144, "Q6_K": 210}[kind]
    blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    if kind == "Q4_K":
        blocks[..., 0:4] = np.array([1e-4, 1e-4], np.float16).view(np.uint8)  # d, dmin
    else:
        blocks[..., 208:210] = np.array([2e-5], np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def _safetensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {name: value.astype(np.float32) for name, value in load_file(folder / "model.safetensors").items()}
