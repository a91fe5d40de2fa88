"""WindowBlocks: the pool blocks of each Whisper window, from the text engine's BlockPool (its reference
counts, free queue and prefix cache), keyed by the audio.

A window holds two kinds of blocks:
- cross blocks: the encoder's cross-attention K/V of its 30 seconds of audio (1500 positions: 94 blocks
  of 16), written once at admission. They are cached under the window's audio digest as one unit: a
  later window with the same features (the same file again, a translation of it, a retry after
  preemption) finds all of them and skips the encoder; a partial find is a miss.
- self blocks: the decoder's own K/V, grown a block at a time as tokens are decoded. Full blocks are
  cached under (audio digest, the tokens so far), the text engine's chained keys with the audio digest
  in the place of the LoRA key: the decoder's K/V depend on the audio through cross-attention, so the
  same tokens over other audio never match.

When the pool runs short while windows grow, the transcriber preempts the latest admitted window (the
text scheduler's rule): its blocks go back to the free queue still hashed, and when it is admitted
again its cross blocks and full self blocks are usually still there, so recomputing costs little.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ortinf.runtime.block_pool import BlockPool, KVCacheBlock


@dataclass(slots=True)
class Held:
    """One window's blocks and audio key."""

    key: str
    cross_count: int = 0  # cross blocks it needs (0: the pool's default, a whole 30-second window)
    cross: list[KVCacheBlock] = field(default_factory=list)
    blocks: list[KVCacheBlock] = field(default_factory=list)  # self-attention, in position order
    cached: int = 0  # self blocks already hashed
    encoded: bool = False  # its cross blocks hold its audio (a cache hit, or written by the encoder)


def audio_key(features: np.ndarray) -> str:
    return "audio:" + hashlib.blake2b(np.ascontiguousarray(features).tobytes(), digest_size=16).hexdigest()


class WindowBlocks:
    def __init__(self, num_blocks: int, block_size: int, cross_blocks: int, enable_caching: bool = True) -> None:
        self.pool = BlockPool(num_blocks, enable_caching)
        self.block_size = block_size
        self.cross_count = cross_blocks
        self.cross_hits = 0  # windows whose encoder output was found in the pool
        self.self_hit_tokens = 0

    def _cross_keys(self, held: Held) -> list[tuple[int, tuple]]:
        keys = [("cross:" + held.key, (i,)) for i in range(held.cross_count or self.cross_count)]
        return [(hash(k), k) for k in keys]

    def _self_keys(self, key: str, tokens: list[int], count: int) -> list[tuple[int, tuple]]:
        keys, parent = [], key
        for i in range(count):
            k = (parent, tuple(tokens[i * self.block_size : (i + 1) * self.block_size]))
            parent = hash(k)
            keys.append((parent, k))
        return keys

    def admit(self, held: Held, tokens: list[int], known: int) -> int | None:
        """Cross blocks (found or new) and self blocks for the first `known` tokens, after the self-prefix
        hits; returns how many tokens the hits cover, or None (nothing taken) when the pool is short."""
        cross = [self.pool.get_cached_block(h, k) for h, k in self._cross_keys(held)]
        count = len(cross)
        found = all(block is not None for block in cross)
        hits = []
        if found:
            for h, k in self._self_keys(held.key, tokens, (known - 1) // self.block_size):  # leave a token to compute
                block = self.pool.get_cached_block(h, k)
                if block is None:
                    break
                hits.append(block)
        reused = (cross if found else []) + hits
        needed = (0 if found else count) + max(-(-known // self.block_size) - len(hits), 0)
        if needed > self.pool.num_free_blocks - sum(1 for b in reused if b.ref_cnt == 0):
            return None
        self.pool.touch(reused)
        held.cross = cross if found else self.pool.get_new_blocks(count)
        held.encoded = found
        held.blocks = hits + self.pool.get_new_blocks(max(-(-known // self.block_size) - len(hits), 0))
        held.cached = len(hits)
        self.cross_hits += found
        self.self_hit_tokens += len(hits) * self.block_size
        return len(hits) * self.block_size

    def encoded(self, held: Held) -> None:
        """The encoder wrote the window's cross blocks: cached from now on."""
        held.encoded = True
        for block, (h, k) in zip(held.cross, self._cross_keys(held)):
            self.pool.cache_full_block(block, h, k)

    def grow(self, held: Held, num_tokens: int) -> bool:
        """Self blocks for `num_tokens` positions; False (nothing taken) when the pool is short."""
        needed = -(-num_tokens // self.block_size) - len(held.blocks)
        if needed > self.pool.num_free_blocks:
            return False
        if needed > 0:
            held.blocks += self.pool.get_new_blocks(needed)
        return True

    def cache(self, held: Held, tokens: list[int], computed: int) -> None:
        """Hashes the self blocks full of computed tokens."""
        full = computed // self.block_size
        if full > held.cached:
            for i, (h, k) in enumerate(self._self_keys(held.key, tokens, full)[held.cached :], held.cached):
                self.pool.cache_full_block(held.blocks[i], h, k)
            held.cached = full

    def retry(self, held: Held, prompt_len: int) -> int:
        """A retry at another temperature decodes again after the prompt: the self blocks full of prompt
        tokens are kept (one token left to compute, for its logits), the rest freed; returns the
        positions kept."""
        keep = (prompt_len - 1) // self.block_size
        self.pool.free_blocks(reversed(held.blocks[keep:]))
        held.blocks, held.cached = held.blocks[:keep], min(held.cached, keep)
        return keep * self.block_size

    def free(self, held: Held) -> None:
        """Frees all of the window's blocks, tail first; hashed ones stay findable until reused."""
        self.pool.free_blocks(reversed(held.blocks))
        held.blocks, held.cached = [], 0
        self.pool.free_blocks(reversed(held.cross))
        held.cross, held.encoded = [], False


__all__ = ["Held", "WindowBlocks", "audio_key"]
