"""ortinf.runtime.sample.whisper_rules.py against transformers' WhisperTimeStampLogitsProcessor: the same tokens
allowed after random histories of text and timestamps, and segments read back from the tokens."""

from __future__ import annotations

import numpy as np
import torch
import transformers
from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

from ortinf.runtime.sample.whisper_rules import TimestampRules

NO_TS, EOS, VOCAB = 100, 50, 160  # timestamps are 101..159


def test_the_rules_match_transformers():
    config = transformers.GenerationConfig(no_timestamps_token_id=NO_TS, eos_token_id=EOS, max_initial_timestamp_index=10)
    prompt = [1, 2, 3]
    theirs = WhisperTimeStampLogitsProcessor(config, begin_index=len(prompt))
    ours = TimestampRules(NO_TS, EOS, 10)
    rng = np.random.default_rng(0)
    for trial in range(300):
        length = int(rng.integers(0, 8))
        sampled = [int(t) for t in rng.choice(np.r_[rng.integers(3, 99, 4), rng.integers(101, VOCAB, 4)], length)]
        logits = rng.normal(0, 3, VOCAB).astype(np.float32)
        if trial % 3 == 0:
            logits[101:] += 4  # timestamps likely: the mass rule decides
        want = theirs(torch.tensor([prompt + sampled]), torch.from_numpy(logits)[None]).numpy()[0]
        got = ours.apply(logits, sampled)
        assert np.array_equal(np.isinf(got), np.isinf(want)), (sampled, np.flatnonzero(np.isinf(got) != np.isinf(want)))
        assert np.allclose(got[np.isfinite(got)], want[np.isfinite(want)])


def test_segments():
    rules = TimestampRules(NO_TS, EOS)
    tokens = [101, 7, 8, 151, 151, 9, 159, 120]  # <|0.00|> a b <|1.00|> <|1.00|> c <|1.16|> <|0.38|>(unclosed)
    assert rules.segments(tokens, offset=30.0) == [(30.0, 31.0, [7, 8]), (31.0, 31.16, [9])]
