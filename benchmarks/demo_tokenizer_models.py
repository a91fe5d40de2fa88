"""Random-weight llamas that speak the bundled demo's tokenizer (vocabulary 8,192), built and exported
once into a work folder: for benchmarks that need text (structured output, speculative decoding)
on models other than the demo."""

from __future__ import annotations

import shutil
from pathlib import Path

from ortinf.bundled import DEMO_LLAMA

# The engine benchmark's model (benchmarks/offline.py): hidden 512, 8 layers, 8 heads, 4 KV heads.
LLAMA_33M = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=4, max_position_embeddings=2048)


def random_llama(work: Path, name: str, config: dict | None = None) -> Path:
    """`work/name`: a llama with random weights (seed 0) and the demo's tokenizer, exported once.
    Without `config`, the demo's own shape."""
    package = work / name
    if (package / "ortinf.json").is_file():
        return package
    import torch
    import transformers

    import ortinf

    hf = work / f"{name}-hf"
    torch.manual_seed(0)
    llama_config = transformers.LlamaConfig(**config) if config else transformers.LlamaConfig.from_pretrained(DEMO_LLAMA)
    llama_config.torch_dtype = "float32"
    transformers.LlamaForCausalLM(llama_config).save_pretrained(hf)
    for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(DEMO_LLAMA / file, hf / file)
    ortinf.export(hf, package, progress=True)
    return package
