"""How one step's sequences are split into graph calls.

The portable kernel pads every sequence of a call to the call's longest query (Q) and its longest
cached context (P, in whole blocks), so its attention work is num_seqs * Q * (P + Q) "cells",
however short most sequences are. The weight MatMuls see only the real tokens, so splitting a step
costs little besides a fixed price per call (the graph's small ops and one more pass over the
weights). The planner weighs the two:

- single-token decodes always form one call (their Q is 1; one call reads the weights once for all);
- prefill chunks are sorted by length and cut into the contiguous runs that minimise
  sum(CALL_COST + cells), by dynamic programming (at most max_num_seqs chunks: a few thousand steps
  of arithmetic, and only on steps that carry prompt tokens).

CALL_COST is in cells: a call's fixed price (~3.6 ms on 2 cores) over the time of one cell (~0.2 us,
measured on the 33.6M llama, whose attention is 8 layers x 8 heads x 64 dims). A model with wider
attention has costlier cells, which only makes splitting pay off sooner; the constant errs on the
side of fewer calls. benchmarks/decode_step.py measures a padded call; docs/runtime.md has the
numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

CALL_COST = 18_000


def padded_cells(query_lens: Sequence[int], past_lens: Sequence[int]) -> int:
    """Attention cells of one call: num_seqs * max query * (max past + max query)."""
    longest = max(query_lens)
    return len(query_lens) * longest * (max(past_lens) + longest)


def plan_calls(query_lens: Sequence[int], context_lens: Sequence[int], block_size: int) -> list[list[int]]:
    """Groups of indices (each index once), one graph call per group, decodes last."""
    past_lens = [max(1, -(-c // block_size)) * block_size for c in context_lens]
    decodes = [i for i, n in enumerate(query_lens) if n == 1]
    prefills = sorted((i for i, n in enumerate(query_lens) if n > 1), key=lambda i: (query_lens[i] + past_lens[i], i))
    groups = _cheapest_runs(prefills, query_lens, past_lens)
    return groups + [decodes] if decodes else groups


def _cheapest_runs(order: list[int], query_lens: Sequence[int], past_lens: Sequence[int]) -> list[list[int]]:
    """Splits `order` into contiguous runs minimising sum(CALL_COST + padded cells)."""
    n = len(order)
    best = [0] * (n + 1)  # best[j]: cheapest cost of order[:j]
    cut = [0] * (n + 1)  # cut[j]: start of the last run in that plan
    for end in range(1, n + 1):
        longest_query = longest_past = 0
        options = []
        for start in range(end - 1, -1, -1):
            longest_query = max(longest_query, query_lens[order[start]])
            longest_past = max(longest_past, past_lens[order[start]])
            options.append((best[start] + CALL_COST + (end - start) * longest_query * (longest_past + longest_query), start))
        best[end], cut[end] = min(options)
    runs, end = [], n
    while end > 0:
        runs.append(order[cut[end] : end])
        end = cut[end]
    return runs[::-1]
