"""KVCacheManager: the scheduler's only view of KV memory. Maps requests to blocks.

Prefix caching: a request's full blocks are hashed in a chain, checked against the tokens on a hit, and cached
only after the step that wrote their K/V (`cache_blocks`). One-step requests (a beam search's steps) also leave
their last, partly filled block cached for the next step of their beam. With --prefix-cache-dir, full blocks also
go to disk and a miss is looked up there (ortinf/runtime/worker/prefix_store.py). Encoder-decoder requests also
hold cross blocks, taken at admission all or nothing and cached as one unit under their input's digest.

The design (the hash chain and its cap, why cache after the step, partial blocks, the disk, cross blocks):
docs/runtime.md, "The KV cache manager"."""

from __future__ import annotations

from dataclasses import dataclass

from ortinf.runtime.core.block_pool import BlockPool, KVCacheBlock, PrefixKey
from ortinf.runtime.core.request import Request


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
        self.req_to_cross: dict[str, list[KVCacheBlock]] = {}  # encoder-decoders: the cross blocks of each request
        self.to_encode: set[str] = set()  # requests whose cross blocks wait for the encoder (this step's admissions)
        self.stats = PrefixCacheStats()
        self.num_cross_hits = 0  # admissions whose encoder output was found in the pool
        self.store = None  # a PrefixStore (ortinf/runtime/worker/prefix_store.py) with --prefix-cache-dir

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def _prefix_keys(self, request: Request, num_full_blocks: int) -> list[tuple[int, PrefixKey]]:
        """(hash, key) of the request's first `num_full_blocks` blocks; hashes are memoised."""
        hashes = request.block_hashes
        keys = []
        parent: int | str | None = request.cache_salt  # blocks computed under another adapter or encoder input never match
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
        keys = self._prefix_keys(request, max_blocks)
        for block_hash, key in keys:
            block = self.pool.get_cached_block(block_hash, key)
            if block is None:
                break
            hits.append(block)
        if self.store is not None and len(hits) < max_blocks and not request.options.top_candidates:
            hits += self._restore(request, keys, hits, max_blocks)
        num_hit_tokens = len(hits) * self.block_size
        if request.options.top_candidates and len(hits) == max_blocks:  # a beam's last step left its partial block?
            tail = self._tail_key(request, keys[-1][0] if keys else request.cache_salt, len(hits) * self.block_size, request.num_tokens - 1)
            if tail is not None:
                block = self.pool.get_cached_block(*tail)
                if block is not None and block.ref_cnt == 0 and block.num_partial == len(tail[1][1]):
                    hits.append(block)
                    num_hit_tokens += block.num_partial
        return hits, num_hit_tokens

    def _disk_keys(self, request: Request, num_full_blocks: int) -> list[str] | None:
        """The stable keys of the request's first full blocks in the prefix store (None: it is not stored: LoRA)."""
        if request.lora_key is not None:
            return None
        from ortinf.runtime.worker.prefix_store import chain

        keys = request.disk_keys
        if len(keys) < num_full_blocks:
            size = self.block_size
            blocks = [request.all_token_ids[i * size : (i + 1) * size] for i in range(num_full_blocks)]
            keys[:] = chain(self.store.identity, request.cache_salt, blocks)
        return keys[:num_full_blocks]

    def _restore(self, request: Request, keys: list[tuple[int, PrefixKey]], hits: list[KVCacheBlock], max_blocks: int) -> list[KVCacheBlock]:
        """The request's blocks after its in-memory hits that the prefix store holds, read into free blocks and cached
        (left in the free queue, as hits are: allocate_slots takes them). At most half the free blocks are used."""
        disk = self._disk_keys(request, max_blocks)
        start = len(hits)
        if disk is None or not self.store.has(disk[start]):
            return []
        self.pool.touch(hits)  # the hits in the free queue must not be the blocks the restore takes
        stored = []
        for i in range(start, min(max_blocks, start + self.pool.num_free_blocks // 2)):
            if not self.store.has(disk[i]):
                break
            stored.append(i)
        blocks = self.pool.get_new_blocks(len(stored))
        count = self.store.load_many([disk[i] for i in stored], [b.block_id for b in blocks])
        for i, block in zip(stored[:count], blocks):
            self.pool.cache_full_block(block, *keys[i])
        self.pool.free_blocks(reversed(blocks[count:]))  # unread: plain free blocks again
        restored = blocks[:count]
        self.pool.free_blocks(reversed([*hits, *restored]))
        return restored

    def _tail_key(self, request: Request, parent: int | str | None, start: int, end: int) -> tuple[int, PrefixKey] | None:
        """(hash, key) of a partial block holding the request's tokens [start, end), or None when there are none."""
        if end <= start:
            return None
        key: PrefixKey = (parent, tuple(request.all_token_ids[start:end]))
        return hash(("partial", key)), key

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Counts one admitted request's lookup (failed admissions are retried, so not counted)."""
        if self.enable_caching:
            self.stats.num_queries += num_tokens
            self.stats.num_hits += num_hit_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock] | None = None) -> list[KVCacheBlock] | None:
        """Blocks for `num_new_tokens` more tokens (after prefix hits); None when the pool is short.

        Nothing changes when it returns None, so the caller can preempt and try again.
        """
        computed = new_computed_blocks or []
        blocks = self.req_to_blocks.get(request.request_id, [])
        covered = sum(b.num_partial or self.block_size for b in computed)  # a beam's partial block counts its slots only
        num_tokens = request.num_computed_tokens + covered + num_new_tokens
        num_needed = -(-num_tokens // self.block_size) - len(blocks) - len(computed)
        cross_hits, num_cross = self._cross_lookup(request)
        # prefix hits sitting in the free queue stop being free once touched
        num_revived = sum(1 for b in (*computed, *cross_hits) if b.ref_cnt == 0)
        if max(num_needed, 0) + num_cross > self.pool.num_free_blocks - num_revived:
            return None
        self.pool.touch(computed)  # before any new block is taken: taking one may evict a hit still in the free queue
        num_full = len(computed)
        if computed and computed[-1].num_partial:  # taken over whole: this request writes its next slots
            self.pool.claim_partial(computed[-1])
            num_full -= 1
        if request.encoder_input is not None and request.request_id not in self.req_to_cross:
            self.pool.touch(cross_hits)
            self.req_to_cross[request.request_id] = cross_hits or self.pool.get_new_blocks(num_cross)
            if cross_hits:
                self.num_cross_hits += 1
            else:
                self.to_encode.add(request.request_id)
        new_blocks = self.pool.get_new_blocks(max(num_needed, 0))
        self.req_to_blocks[request.request_id] = blocks + computed + new_blocks
        if num_full:
            self.num_cached_blocks[request.request_id] = num_full
        return new_blocks

    def _cross_keys(self, request: Request) -> list[tuple[int, PrefixKey]]:
        encoder = request.encoder_input
        keys = [("cross:" + encoder.digest, (i,)) for i in range(-(-encoder.num_positions // self.block_size))]
        return [(hash(key), key) for key in keys]

    def _cross_lookup(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """(the cached cross blocks of a request being admitted, all or none; how many new ones it needs)."""
        if request.encoder_input is None or request.request_id in self.req_to_cross:
            return [], 0
        keys = self._cross_keys(request)
        if self.enable_caching:
            found = [self.pool.get_cached_block(h, k) for h, k in keys]
            if all(block is not None for block in found):
                return found, 0
        return [], len(keys)

    def cross_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_cross.get(request_id, [])]

    def cache_blocks(self, request: Request) -> None:
        """Hashes the request's blocks that are full of computed tokens, and the cross blocks the
        encoder wrote (call after the step)."""
        if request.request_id in self.to_encode:
            self.to_encode.discard(request.request_id)
            if self.enable_caching:
                for block, (h, k) in zip(self.req_to_cross[request.request_id], self._cross_keys(request)):
                    self.pool.cache_full_block(block, h, k)
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
        if self.store is not None and not request.options.top_candidates:
            disk = self._disk_keys(request, num_full)
            for i in range(start, num_full) if disk is not None else ():
                self.store.save(disk[i], blocks[i].block_id)

    def trim(self, request: Request) -> None:
        """Gives back the blocks past the request's tokens (slots written for rejected speculative
        tokens); they are never cached, as only blocks full of computed tokens are."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        keep = -(-request.num_tokens // self.block_size)
        if len(blocks) > keep:
            self.req_to_blocks[request.request_id] = blocks[:keep]
            self.pool.free_blocks(reversed(blocks[keep:]))

    def reserve(self, request_id: str, num_tokens: int) -> bool:
        """Blocks for a sequence's first `num_tokens` positions, by id and without prefix lookups (a draft
        model's own pool: ortinf/runtime/engine/draft_proposer.py); False, and nothing taken, when the pool is short."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        needed = -(-num_tokens // self.block_size) - len(blocks)
        if needed > self.pool.num_free_blocks:
            return False
        if needed > 0:
            blocks += self.pool.get_new_blocks(needed)
        return True

    def free(self, request: Request) -> None:
        """Releases all blocks of the request, tail first (tail blocks are evicted first)."""
        if self.enable_caching and request.options.top_candidates:
            self._cache_tail(request)
        self.free_id(request.request_id)

    def _cache_tail(self, request: Request) -> None:
        """A beam step's last, partly filled block, cached for the next step of its beam (see the module docstring)."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        computed = min(request.num_computed_tokens, request.num_tokens)
        full = computed // self.block_size
        keys = self._prefix_keys(request, full)
        tail = self._tail_key(request, keys[-1][0] if keys else request.cache_salt, full * self.block_size, computed)
        if tail is not None and full < len(blocks):
            self.pool.cache_partial_block(blocks[full], *tail, computed - full * self.block_size)

    def free_id(self, request_id: str) -> None:
        """`free` by request id: its self blocks, then its cross blocks."""
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_blocks.pop(request_id, None)
        self.pool.free_blocks(reversed(blocks))
        self.pool.free_blocks(reversed(self.req_to_cross.pop(request_id, [])))
        self.to_encode.discard(request_id)

    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    def check_invariants(self) -> None:
        self.pool.check_invariants({**self.req_to_blocks, **{f"{rid} (cross)": b for rid, b in self.req_to_cross.items()}})
