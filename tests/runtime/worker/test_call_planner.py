"""The call planner: every sequence in exactly one call, decodes together, and the cheapest split."""

from __future__ import annotations

import itertools
import random

from ortinf.runtime.worker.call_planner import CALL_COST, padded_cells, plan_calls

BLOCK = 16


def plan_cost(groups: list[list[int]], query_lens: list[int], context_lens: list[int]) -> int:
    past = [max(1, -(-c // BLOCK)) * BLOCK for c in context_lens]
    return sum(CALL_COST + padded_cells([query_lens[i] for i in g], [past[i] for i in g]) for g in groups)


def test_decodes_form_one_call_after_the_prefills() -> None:
    query_lens = [1, 40, 1, 1, 300, 1]
    groups = plan_calls(query_lens, [10, 0, 200, 33, 0, 5], BLOCK)
    assert groups[-1] == [0, 2, 3, 5]
    assert sorted(i for g in groups[:-1] for i in g) == [1, 4]


def test_similar_prompts_share_a_call_and_very_different_ones_do_not() -> None:
    assert plan_calls([100, 104, 108, 112], [0, 0, 0, 0], BLOCK) == [[0, 1, 2, 3]]
    groups = plan_calls([8, 8, 8, 8, 8, 8, 900], [0] * 7, BLOCK)
    assert sorted(map(sorted, groups)) == [[0, 1, 2, 3, 4, 5], [6]]


def test_a_chunk_with_a_long_cached_context_is_kept_away_from_fresh_prompts() -> None:
    query_lens = [150] * 10 + [150]
    context_lens = [0] * 10 + [2000]
    groups = plan_calls(query_lens, context_lens, BLOCK)
    assert [10] in groups


def test_every_index_once_and_the_plan_is_the_cheapest_contiguous_split() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 7)
        query_lens = [rng.choice([1, rng.randint(2, 400)]) for _ in range(n)]
        context_lens = [rng.choice([0, rng.randint(0, 600)]) for _ in range(n)]
        groups = plan_calls(query_lens, context_lens, BLOCK)
        assert sorted(i for g in groups for i in g) == list(range(n))
        assert all(groups)
        prefills = [i for i in range(n) if query_lens[i] > 1]
        past = [max(1, -(-c // BLOCK)) * BLOCK for c in context_lens]
        order = sorted(prefills, key=lambda i: (query_lens[i] + past[i], i))
        decodes = [[i for i in range(n) if query_lens[i] == 1]] if len(prefills) < n else []
        best = min(
            plan_cost([order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)))] + decodes, query_lens, context_lens)
            for k in range(len(order))
            for cuts in itertools.combinations(range(1, len(order)), k)
        ) if order else plan_cost(decodes, query_lens, context_lens)
        assert plan_cost(groups, query_lens, context_lens) == best
