"""ortinf/tasks/speech/audio_features.py (numpy, what serving runs) against transformers' WhisperFeatureExtractor:
the same features for short, exactly-30-second and longer-than-window audio, 80 and 128 mel bins."""

from __future__ import annotations

import numpy as np
import pytest
import transformers

from ortinf.tasks.speech.audio_features import SAMPLE_RATE, log_mel


@pytest.mark.parametrize("mels", [80, 128])
@pytest.mark.parametrize("seconds", [0.5, 7.3, 30.0, 31.0])
def test_log_mel_matches_the_feature_extractor(mels, seconds):
    extractor = transformers.WhisperFeatureExtractor(feature_size=mels)
    rng = np.random.default_rng(int(seconds * 10) + mels)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    audio = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)
    want = extractor(audio, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features[0]
    got = log_mel(audio, extractor.mel_filters)
    assert got.shape == want.shape == (mels, 3000)
    assert np.abs(got - want).max() < 1e-4
