"""GGUF files in (llama.cpp's and Ollama's model files): `ortinf export model.gguf -o pkg`.

transformers reads a GGUF (its `gguf_file` loading, with the `gguf` package): the architecture and the
tokenizer from the file's metadata, the weights dequantized to fp32 (F32, F16, Q8_0, Q4_0 and the
K-quants alike). That model is written as a Hugging Face folder in a temporary place and exported from
there like any other, at the `--dtype` asked for: `--dtype int8` / `int4` quantize again, through the
quality gate, so a Q4_K_M file's package holds ortinf's own int4 blocks, not the file's.

What is left out: mapping Q8_0/Q4_0 blocks straight onto MatMulNBits (the same values, no second rounding).
"""

from __future__ import annotations

from pathlib import Path

from ortinf.errors import ExportError


def gguf_to_folder(path: Path, folder: Path) -> Path:
    """Writes the GGUF at `path` into `folder` as a Hugging Face model folder (config, fp32 weights, tokenizer)."""
    import torch
    import transformers

    try:
        import gguf  # noqa: F401 - transformers needs it to read the file
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("reading GGUF files needs the gguf package", name="gguf") from exc
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except (ValueError, KeyError, RuntimeError, OSError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"cannot read the GGUF file {path}: {first[:200]} (transformers reads the GGUFs of llama, mistral, qwen2, "
                          "qwen3, phi3, gemma2/3, ... ; export the Hugging Face folder instead if it has one)") from exc
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
