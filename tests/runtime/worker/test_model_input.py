"""ModelInput: flat arrays, slots of the new tokens, and the graph's block tables over cached tokens."""

from __future__ import annotations

import numpy as np
import pytest

from ortinf.providers.base import POWER_OF_TWO_BUCKETS, bucket
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input, pad_to_buckets

BLOCK = 16


def test_flat_layout_positions_and_slots() -> None:
    chunks = [SequenceChunk([5, 6, 7], 0, [4]), SequenceChunk([9], 20, [7, 2])]
    model_input = build_model_input(chunks, BLOCK)
    assert model_input.input_ids.tolist() == [5, 6, 7, 9]
    assert model_input.positions.tolist() == [0, 1, 2, 20]
    assert model_input.slot_mapping.tolist() == [4 * BLOCK, 4 * BLOCK + 1, 4 * BLOCK + 2, 2 * BLOCK + 4]
    assert model_input.logits_indices.tolist() == [2, 3]


def test_block_tables_cover_only_the_cached_tokens() -> None:
    # A fresh prompt has nothing cached: the graph still gets one (masked) block column.
    fresh = build_model_input([SequenceChunk(list(range(40)), 0, [3, 8, 1])], BLOCK)
    assert fresh.block_tables.shape == (1, 1)
    assert fresh.slot_mapping.tolist() == [3 * BLOCK + i for i in range(16)] + [8 * BLOCK + i for i in range(16)] + [
        1 * BLOCK + i for i in range(8)
    ]
    # 33 cached tokens live in 3 blocks; the decode's own slot (position 33) is in the third.
    step = build_model_input([SequenceChunk([1], 33, [6, 2, 9]), SequenceChunk([1, 2], 5, [4])], BLOCK)
    assert step.block_tables.tolist() == [[6, 2, 9], [4, 0, 0]]
    assert step.slot_mapping.tolist() == [9 * BLOCK + 1, 4 * BLOCK + 5, 4 * BLOCK + 6]
    assert step.block_tables.flags["C_CONTIGUOUS"]
    assert step.block_tables.dtype == np.int64


@pytest.mark.parametrize("shape", [[1], [1, 1, 1], [7], [33], [5, 1, 1], [20, 3], [1] * 13, [100, 1, 1, 1, 1, 1]])
def test_padding_to_buckets_keeps_the_real_step(shape: list[int]) -> None:
    """Padding sequences hold 1..longest tokens each, write into the scratch block, and leave the
    real tokens, tables and logits rows untouched; every padded size is a bucket."""
    rng = np.random.default_rng(len(shape))
    chunks = [SequenceChunk(rng.integers(0, 99, n).tolist(), 3 * i, list(range(i * 10, i * 10 + 10))) for i, n in enumerate(shape)]
    real = build_model_input(chunks, BLOCK)
    scratch = 1000 * BLOCK
    padded = pad_to_buckets(real, POWER_OF_TWO_BUCKETS, scratch, BLOCK)
    num_tokens, num_seqs = len(real.input_ids), real.num_seqs
    assert len(padded.input_ids) == bucket(len(padded.input_ids), POWER_OF_TWO_BUCKETS.tokens) >= num_tokens
    assert padded.num_seqs == bucket(padded.num_seqs, POWER_OF_TWO_BUCKETS.seqs) >= num_seqs
    assert padded.block_tables.shape[1] == bucket(real.block_tables.shape[1], POWER_OF_TWO_BUCKETS.blocks)
    assert int(padded.query_lens.sum()) == len(padded.input_ids)  # every padding token belongs to a padding sequence
    assert padded.query_lens.max() == real.query_lens.max() and padded.query_lens[num_seqs:].min(initial=1) >= 1
    assert padded.input_ids[:num_tokens].tolist() == real.input_ids.tolist()
    assert padded.slot_mapping[:num_tokens].tolist() == real.slot_mapping.tolist()
    assert all(scratch <= s < scratch + BLOCK for s in padded.slot_mapping[num_tokens:])
    assert (padded.block_tables[:num_seqs, : real.block_tables.shape[1]] == real.block_tables).all()
    assert (padded.context_lens[num_seqs:] == 0).all() and (padded.block_tables[num_seqs:] == 1000).all()
    assert (padded.full_block_tables[:num_seqs, : real.full_block_tables.shape[1]] == real.full_block_tables).all()
    assert padded.logits_indices[: num_seqs].tolist() == real.logits_indices.tolist()
