"""DecoderGraph: an exported decoder package, its ORT session and its paged KV pool.

Runs one ModelInput per call and writes the new K/V into the pool in place (numpy, slot mapping);
the graph never outputs the pool, so nothing is copied but the new tokens' K/V.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ortinf.errors import ConfigError
from ortinf.manifest import KV_LAYOUT, MODEL_NAME, TEXT_GENERATION, DecoderSpec, Manifest
from ortinf.providers.registry import resolve
from ortinf.providers.session import create_session
from ortinf.runtime.model_input import ModelInput

NUMPY_DTYPES = {"fp32": np.float32, "fp16": np.float16}


class DecoderGraph:
    """The decoder graph of a package with a KV pool of `num_blocks` blocks of `block_size` tokens."""

    def __init__(
        self,
        package_dir: str | Path,
        num_blocks: int,
        block_size: int = 16,
        provider: str = "auto",
        intra_op_threads: int = 0,
    ) -> None:
        self.manifest = Manifest.load(package_dir)
        if self.manifest.task != TEXT_GENERATION or self.manifest.decoder is None:
            raise ConfigError(f"{package_dir} holds a {self.manifest.task} model, not a text-generation decoder")
        self.spec: DecoderSpec = self.manifest.decoder
        if self.spec.kv_layout != KV_LAYOUT:
            raise ConfigError(f"{package_dir} uses KV layout {self.spec.kv_layout}; re-export it with this ortinf")
        self.provider = resolve(provider)
        self.session = create_session(Path(package_dir) / MODEL_NAME, self.provider, intra_op_threads)
        self.block_size = block_size
        shape = (self.spec.num_kv_heads, num_blocks, block_size, self.spec.head_dim)
        dtype = NUMPY_DTYPES[self.spec.kv_dtype]
        self.key_caches = [_touched_zeros(shape, dtype) for _ in range(self.spec.num_layers)]
        self.value_caches = [_touched_zeros(shape, dtype) for _ in range(self.spec.num_layers)]
        self._cache_feeds = {}
        for i in range(self.spec.num_layers):
            self._cache_feeds[f"key_cache.{i}"] = self.key_caches[i]
            self._cache_feeds[f"value_cache.{i}"] = self.value_caches[i]

    def run(self, model_input: ModelInput) -> np.ndarray:
        """Runs one step; returns logits [num_seqs, vocab] and writes the new K/V into the pool."""
        outputs = self.session.run(None, {**model_input.feeds(), **self._cache_feeds})
        slots = model_input.slot_mapping
        kv_heads, head_dim = self.spec.num_kv_heads, self.spec.head_dim
        for i in range(self.spec.num_layers):  # new K/V are [num_tokens, kv_heads, head_dim]
            self.key_caches[i].reshape(kv_heads, -1, head_dim)[:, slots] = outputs[1 + 2 * i].swapaxes(0, 1)
            self.value_caches[i].reshape(kv_heads, -1, head_dim)[:, slots] = outputs[2 + 2 * i].swapaxes(0, 1)
        return outputs[0]


def _touched_zeros(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A zeroed array whose pages are all mapped now (~0.4 s per GiB, once at start-up).

    np.zeros maps pages lazily, so without this the first write into each fresh block page-faults
    on the request path: ~90 ms of a 2.5 s benchmark run, and latency jitter while serving. It also
    makes the pool's memory really reserved at start-up, as the size logged says.
    """
    array = np.zeros(shape, dtype=dtype)
    array.fill(0)
    return array
