"""BlockPool: the KV blocks, their reference counts, the free queue and the prefix-hash map.

Only the pool touches these three. A freed block whose contents are hashed stays in the hash map
while it waits in the free queue: a later prefix hit can revive it, and it is evicted (unhashed)
only when the queue hands it out again (lazy eviction). The free queue is a doubly linked list
threaded through the blocks, in eviction order: head is evicted first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# A block's identity for prefix caching: (parent block's hash, the block's token ids).
PrefixKey = tuple[int | str | None, tuple[int, ...]]  # (parent block hash, or the LoRA key of a first block; tokens)


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One block of `block_size` token slots in every layer's pool."""

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    prefix_key: PrefixKey | None = None
    num_partial: int = 0  # a cached partial block (a beam step's last): how many of its slots hold K/V; 0: full or uncached
    prev_free: KVCacheBlock | None = None
    next_free: KVCacheBlock | None = None


class FreeBlockQueue:
    """Doubly linked list of free blocks with O(1) popleft, append and remove-from-middle."""

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.head = KVCacheBlock(-1)  # sentinels
        self.tail = KVCacheBlock(-1)
        self.head.next_free, self.tail.prev_free = self.tail, self.head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self.head.next_free
        assert block is not None and block is not self.tail, "free queue is empty"
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        assert block.prev_free is not None and block.next_free is not None, "block is not in the free queue"
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self.tail.prev_free
        assert last is not None
        last.next_free, block.prev_free = block, last
        block.next_free, self.tail.prev_free = self.tail, block
        self.num_free_blocks += 1

    def __iter__(self):
        block = self.head.next_free
        while block is not None and block is not self.tail:
            yield block
            block = block.next_free


class BlockPool:
    """All `num_blocks` blocks; hands out, frees, caches and revives them."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[int, KVCacheBlock] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def usage(self) -> float:
        """Fraction of blocks in use by requests (cached free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_new_blocks(self, count: int) -> list[KVCacheBlock]:
        """`count` blocks from the head of the free queue, evicting their cached contents."""
        assert count <= self.num_free_blocks, "caller must check num_free_blocks first"
        blocks = []
        for _ in range(count):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                if self.cached.get(block.block_hash) is block:
                    del self.cached[block.block_hash]
                block.block_hash = block.prefix_key = None
                block.num_partial = 0
                self.num_evictions += 1
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def get_cached_block(self, block_hash: int, prefix_key: PrefixKey) -> KVCacheBlock | None:
        """The block holding exactly this prefix, if cached (the tokens are checked, not only the hash)."""
        block = self.cached.get(block_hash)
        if block is None or block.prefix_key != prefix_key:
            return None
        return block

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Takes a reference on prefix-hit blocks, reviving them from the free queue if needed."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def cache_full_block(self, block: KVCacheBlock, block_hash: int, prefix_key: PrefixKey) -> None:
        """Records a full block's hash so later requests with the same prefix can reuse it."""
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash, block.prefix_key = block_hash, prefix_key
        self.cached.setdefault(block_hash, block)

    def cache_partial_block(self, block: KVCacheBlock, block_hash: int, prefix_key: PrefixKey, num_tokens: int) -> None:
        """Records a partly filled block (its first `num_tokens` slots computed) under its prefix, for one later
        request to take over whole (`claim_partial`): a beam's next step continues where the last one stopped."""
        if not self.enable_caching or block.block_hash is not None or block_hash in self.cached:
            return
        block.block_hash, block.prefix_key, block.num_partial = block_hash, prefix_key, num_tokens
        self.cached[block_hash] = block

    def claim_partial(self, block: KVCacheBlock) -> None:
        """Unhashes a partial block a request has taken (it will write its next slots): nobody else can find it."""
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = block.prefix_key = None
        block.num_partial = 0

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drops one reference per block; blocks reaching zero join the free queue in this order."""
        for block in ordered_blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} freed twice"
            if block.ref_cnt == 0:
                if not self.enable_caching:
                    block.block_hash = block.prefix_key = None
                    block.num_partial = 0
                self.free_queue.append(block)

    def check_invariants(self, owners: dict[str, list[KVCacheBlock]]) -> None:
        """Asserts free + used == total, no negative reference counts, and ref counts == owners."""
        free = {b.block_id for b in self.free_queue}
        assert len(free) == self.num_free_blocks, "free queue count is off"
        refs = [0] * self.num_blocks
        for blocks in owners.values():
            for block in blocks:
                refs[block.block_id] += 1
        for block in self.blocks:
            assert block.ref_cnt >= 0, f"block {block.block_id} has ref_cnt {block.ref_cnt}"
            assert block.ref_cnt == refs[block.block_id], f"block {block.block_id}: ref_cnt {block.ref_cnt} != owners {refs[block.block_id]}"
            assert (block.ref_cnt == 0) == (block.block_id in free), f"block {block.block_id} free/used mismatch"
        used = sum(1 for b in self.blocks if b.ref_cnt > 0)
        assert used + self.num_free_blocks == self.num_blocks
        for block_hash, block in self.cached.items():
            assert block.block_hash == block_hash, "hash map points at a block with another hash"
