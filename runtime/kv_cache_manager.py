"""KVCacheManager: the scheduler's only view of KV memory. Maps requests to blocks.

Prefix caching: a request's full blocks are hashed in a chain (each hash covers the parent's hash
and the block's tokens), so one hash identifies a whole prefix. A hit is checked against the tokens
and capped at num_tokens - 1, because the last token must be computed to produce logits.

Blocks are cached only after the step that wrote their K/V (`cache_blocks`), never at allocation:
the graph writes new K/V after it runs, so a request in the same step must not read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortinf.runtime.block_pool import BlockPool, KVCacheBlock, PrefixKey
from ortinf.runtime.request import Request


@dataclass(slots=True)
class PrefixCacheStats:
    """Counters in tokens: how many were looked up and how many hit."""

    num_queries: int = 0
    num_hits: int = 0


def needs_prompt_logprobs(request: Request) -> bool:
    """Prompt logprobs are computed while the prompt is computed before the first output token."""
    return request.sampling_params.prompt_logprobs is not None and request.num_output_tokens == 0


class KVCacheManager:
    """Allocates, caches and frees the blocks of each request."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.stats = PrefixCacheStats()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def _prefix_keys(self, request: Request, num_full_blocks: int) -> list[tuple[int, PrefixKey]]:
        """(hash, key) of the request's first `num_full_blocks` blocks; hashes are memoised."""
        hashes = request.block_hashes
        keys = []
        parent: int | str | None = request.lora_key  # blocks computed under different adapters never match
        for i in range(num_full_blocks):
            tokens = tuple(request.all_token_ids[i * self.block_size : (i + 1) * self.block_size])
            key: PrefixKey = (parent, tokens)
            if i == len(hashes):
                hashes.append(hash(key))
            keys.append((hashes[i], key))
            parent = hashes[i]
        return keys

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Cached blocks holding a prefix of the request, and how many tokens they cover.

        A request that still needs its prompt logprobs gets no hits (vLLM's rule): the logits of
        every prompt position must be computed, and a hit would skip them."""
        if not self.enable_caching or needs_prompt_logprobs(request):
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size  # leave at least one token to compute
        hits = []
        for block_hash, key in self._prefix_keys(request, max_blocks):
            block = self.pool.get_cached_block(block_hash, key)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Counts one admitted request's lookup (failed admissions are retried, so not counted)."""
        if self.enable_caching:
            self.stats.num_queries += num_tokens
            self.stats.num_hits += num_hit_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVCacheBlock] | None = None) -> list[KVCacheBlock] | None:
        """Blocks for `num_new_tokens` more tokens (after prefix hits); None when the pool is short.

        Nothing changes when it returns None, so the caller can preempt and try again.
        """
        computed = new_computed_blocks or []
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_tokens = request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        num_needed = -(-num_tokens // self.block_size) - len(blocks) - len(computed)
        # prefix hits sitting in the free queue stop being free once touched
        num_revived = sum(1 for b in computed if b.ref_cnt == 0)
        if num_needed > self.pool.num_free_blocks - num_revived:
            return None
        self.pool.touch(computed)
        new_blocks = self.pool.get_new_blocks(max(num_needed, 0))
        self.req_to_blocks[request.request_id] = blocks + computed + new_blocks
        if computed:
            self.num_cached_blocks[request.request_id] = len(computed)
        return new_blocks

    def cache_blocks(self, request: Request) -> None:
        """Hashes the request's blocks that are full of computed tokens (call after the step)."""
        if not self.enable_caching:
            return
        num_full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        start = self.num_cached_blocks.get(request.request_id, 0)
        if num_full <= start:
            return
        blocks = self.req_to_blocks[request.request_id]
        for i, (block_hash, key) in enumerate(self._prefix_keys(request, num_full)[start:], start):
            self.pool.cache_full_block(blocks[i], block_hash, key)
        self.num_cached_blocks[request.request_id] = num_full

    def trim(self, request: Request) -> None:
        """Gives back the blocks past the request's tokens (slots written for rejected speculative
        tokens); they are never cached, as only blocks full of computed tokens are."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        keep = -(-request.num_tokens // self.block_size)
        if len(blocks) > keep:
            self.req_to_blocks[request.request_id] = blocks[:keep]
            self.pool.free_blocks(reversed(blocks[keep:]))

    def free(self, request: Request) -> None:
        """Releases all blocks of the request, tail first (tail blocks are evicted first)."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    def check_invariants(self) -> None:
        self.pool.check_invariants(self.req_to_blocks)
