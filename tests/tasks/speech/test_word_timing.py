"""ortinf/tasks/speech/word_timing.py against transformers' own functions: DTW paths (ties included: small integer
costs tie everywhere), the median filter, and word grouping."""

from __future__ import annotations

import numpy as np
import torch
from transformers.models.whisper.generation_whisper import _dynamic_time_warping, _median_filter

from ortinf.tasks.speech.word_timing import dtw, median_filter, words


def test_dtw_equals_transformers_including_ties():
    rng = np.random.default_rng(0)
    for shape in [(1, 1), (1, 7), (7, 1), (5, 9), (23, 180), (40, 31)]:
        for matrix in (rng.standard_normal(shape), rng.integers(-2, 3, shape).astype(np.float64)):
            ours, theirs = dtw(matrix), _dynamic_time_warping(matrix)
            assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1]), shape


def test_median_filter_equals_transformers():
    x = np.random.default_rng(1).standard_normal((3, 6, 50)).astype(np.float32)
    for width in (1, 3, 7):
        assert np.array_equal(median_filter(x, width), _median_filter(torch.from_numpy(x), width).numpy())
    short = x[..., :3]
    assert np.array_equal(median_filter(short, 7), short)  # too short to filter: as transformers


def test_words_join_tokens_at_spaces():
    pieces = [(" Hello", 0.0, 0.4), (",", 0.4, 0.5), (" wor", 0.6, 0.8), ("ld", 0.8, 1.0), ("", 1.0, 1.0), (" !", 1.1, 1.2)]
    assert words(pieces) == [("Hello,", 0.0, 0.5), ("world", 0.6, 1.0), ("!", 1.1, 1.2)]
