"""ortinf/tasks/speech/audio_file.py decode_audio: memory follows the 16 kHz mono result, not the file's
channels x rate (issue 30, finding 1: an 8-channel 48 kHz FLAC of silence took 7.2 GB), the result
equals the one-shot mix-down and resampling, and a file that is not audio is a 400 naming no object."""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
import soundfile
import soxr

from ortinf.errors import RequestError
from ortinf.tasks.speech.audio_file import decode_audio


def flac(samples: np.ndarray, rate: int) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="FLAC")
    return buffer.getvalue()


def test_many_channels_of_silence_decode_in_blocks():
    rate, seconds, channels = 48_000, 150, 8
    data = flac(np.zeros((rate * seconds, channels), dtype=np.int16), rate)
    assert len(data) < 2_000_000  # compressed silence: small on the wire
    tracemalloc.start()
    try:
        samples = decode_audio(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    whole = rate * seconds * channels * 4  # 230 MB: the file decoded whole to float32, as before the fix
    assert len(samples) == 16_000 * seconds and samples.dtype == np.float32
    assert peak < 4 * samples.nbytes < whole / 5, peak  # the 9.6 MB result, twice over at most while joined


def test_blocks_equal_the_one_shot_decode():
    rng = np.random.default_rng(0)
    stereo = (rng.standard_normal((44_100 * 3 + 17, 2)) * 0.1).astype(np.float32)
    data = flac(stereo, 44_100)
    decoded, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    expected = soxr.resample(decoded.mean(axis=1, dtype=np.float32), 44_100, 16_000)
    np.testing.assert_array_equal(decode_audio(data), expected)


def test_not_audio_is_a_400_without_object_reprs():
    with pytest.raises(RequestError) as raised:
        decode_audio(b"this is not audio at all" * 10)
    assert raised.value.param == "file" and "object at 0x" not in str(raised.value) and "not audio" in str(raised.value)
