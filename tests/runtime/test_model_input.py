"""ModelInput: flat arrays, slots of the new tokens, and the graph's block tables over cached tokens."""

from __future__ import annotations

import numpy as np

from ortinf.runtime.model_input import SequenceChunk, build_model_input

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
