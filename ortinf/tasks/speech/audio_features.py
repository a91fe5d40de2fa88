"""Whisper's log-mel front end in numpy (no torch, no transformers at serving time).

The same arithmetic as transformers' WhisperFeatureExtractor (its numpy path): the 16 kHz samples
padded or cut to the window (30 s), a centred STFT (reflect padding, a periodic Hann window of
n_fft = 400, hop 160), the power spectrum through the model's mel filter bank (saved into the
package at export: the filters are the model's, 80 or 128 of them), log10 with a floor of 1e-10,
the last frame dropped, values clamped to (max - 8), then (x + 4) / 4.

    samples [n] float32 in [-1, 1]  ->  features [num_mel_bins, 3000]
"""

from __future__ import annotations

import numpy as np

SAMPLE_RATE = 16_000
N_FFT = 400
HOP_LENGTH = 160
WINDOW_SECONDS = 30


def log_mel(samples: np.ndarray, mel_filters: np.ndarray, window_samples: int = SAMPLE_RATE * WINDOW_SECONDS) -> np.ndarray:
    """Whisper's input features of one window of audio. `mel_filters` is [1 + N_FFT // 2, num_mel_bins]."""
    audio = np.zeros(window_samples, dtype=np.float64)
    clip = np.asarray(samples, dtype=np.float64)[:window_samples]
    audio[: len(clip)] = clip
    padded = np.pad(audio, N_FFT // 2, mode="reflect")
    num_frames = 1 + (len(padded) - N_FFT) // HOP_LENGTH
    frames = np.lib.stride_tricks.as_strided(padded, shape=(num_frames, N_FFT), strides=(padded.strides[0] * HOP_LENGTH, padded.strides[0]))
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic Hann
    power = np.abs(np.fft.rfft(frames * window, n=N_FFT)) ** 2  # [frames, 1 + N_FFT // 2]
    mel = np.maximum(1e-10, power @ mel_filters.astype(np.float64)).T  # [mels, frames]
    log_spec = np.log10(mel)[:, :-1]
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)
