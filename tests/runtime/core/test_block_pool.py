"""Block pool and KV-cache manager on their own: free queue order, lazy eviction, prefix hits."""

from __future__ import annotations

import pytest

from ortinf.config import EngineConfig, parse_size
from ortinf.errors import ConfigError
from ortinf.runtime.core.block_pool import BlockPool
from ortinf.runtime.core.kv_cache_manager import KVCacheManager
from ortinf.runtime.core.request import Request
from ortinf.runtime.sample.request_options import RequestOptions
from ortinf.runtime.sample.sampling_params import SamplingParams


def request(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens, SamplingParams())


def test_free_queue_hands_out_in_order_and_frees_to_the_tail():
    pool = BlockPool(6)
    first = pool.get_new_blocks(3)
    assert [b.block_id for b in first] == [0, 1, 2] and pool.num_free_blocks == 3
    pool.free_blocks(reversed(first))  # tail first: block 2 is evicted before block 0
    assert [b.block_id for b in pool.free_queue] == [3, 4, 5, 2, 1, 0]
    pool.check_invariants({})


def test_cached_free_blocks_are_revived_or_lazily_evicted():
    pool = BlockPool(3)
    (block,) = pool.get_new_blocks(1)
    pool.cache_full_block(block, 111, (None, (1, 2)))
    pool.free_blocks([block])
    assert pool.get_cached_block(111, (None, (1, 2))) is block  # still cached while free
    pool.touch([block])
    assert block.ref_cnt == 1 and pool.num_free_blocks == 2
    pool.free_blocks([block])
    pool.get_new_blocks(3)  # the queue reaches the cached block: now it is evicted
    assert pool.get_cached_block(111, (None, (1, 2))) is None and pool.num_evictions == 1


def test_a_hash_hit_is_checked_against_the_tokens():
    pool = BlockPool(2)
    (block,) = pool.get_new_blocks(1)
    pool.cache_full_block(block, 42, (None, (1, 2, 3, 4)))
    assert pool.get_cached_block(42, (None, (9, 9, 9, 9))) is None  # same hash, other tokens
    assert pool.get_cached_block(42, (7, (1, 2, 3, 4))) is None  # same tokens, other parent


def test_manager_prefix_hits_chain_over_full_blocks():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = request("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert kv.allocate_slots(a, 10) is not None
    a.num_computed_tokens = 10
    kv.cache_blocks(a)
    b = request("b", list(range(8)) + [50, 51, 52])
    hits, num_tokens = kv.get_computed_blocks(b)
    assert num_tokens == 8 and hits == kv.req_to_blocks["a"][:2]
    c = request("c", [0, 1, 2, 99] + list(range(4, 8)))  # differs in the first block: no hit at all
    assert kv.get_computed_blocks(c) == ([], 0)
    kv.allocate_slots(b, 3, hits)
    assert [blk.ref_cnt for blk in kv.req_to_blocks["a"][:2]] == [2, 2]
    kv.free(a)
    kv.free(b)
    kv.check_invariants()
    assert kv.num_free_blocks == 10


def test_allocation_failure_changes_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    big = request("big", list(range(20)))
    assert kv.allocate_slots(big, 20) is None
    assert kv.num_free_blocks == 4 and "big" not in kv.req_to_blocks


@pytest.mark.parametrize("text, size", [("4GiB", 4 * 2**30), ("512MB", 512 * 10**6), ("1024", 1024), ("1.5 GiB", 3 * 2**29)])
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_bad_sizes_and_options():
    with pytest.raises(ConfigError, match="cannot read the size"):
        parse_size("lots")
    with pytest.raises(ConfigError, match="max_num_seqs"):
        EngineConfig(package_dir=".", max_num_seqs=0)


def test_a_beam_steps_partial_block_is_taken_over_by_one_request():
    """A beam step (RequestOptions.top_candidates) that ends leaves its partly filled last block cached; the next
    step's request extending the beam takes it over whole (the 6-token history it holds counts as computed), and a
    second request with the same history finds nothing (the block is unhashed, it will be written)."""
    manager = KVCacheManager(num_blocks=8, block_size=4)
    step = RequestOptions(top_candidates=4)
    parent = Request("p", list(range(10, 16)), SamplingParams(), options=step)  # 6 tokens: one full block and 2 in the second
    hits, _ = manager.get_computed_blocks(parent)
    assert manager.allocate_slots(parent, 6, hits) is not None
    parent.num_computed_tokens = 6
    parent.append_output_token(99)  # the step's sampled token, not computed
    manager.cache_blocks(parent)
    manager.free(parent)
    plain = Request("x", [*range(10, 16), 99], SamplingParams())
    assert manager.get_computed_blocks(plain)[1] == 4  # partial blocks are for a beam's next step only
    child = Request("c", [*range(10, 16), 99], SamplingParams(), options=step)  # the parent's history plus the chosen token
    hits, num_hit_tokens = manager.get_computed_blocks(child)
    assert num_hit_tokens == 6 and hits[-1].num_partial == 2
    assert manager.allocate_slots(child, 1, hits) is not None
    assert hits[-1].num_partial == 0 and hits[-1].block_hash is None and manager.num_cached_blocks["c"] == 1
    sibling = Request("s", [*range(10, 16), 98], SamplingParams(), options=step)
    assert manager.get_computed_blocks(sibling)[1] == 4  # the full block only
    manager.check_invariants()
