"""Audio files in, transcripts out: what speech needs at its edges, for the server (ortinf/serve/api/openai/audio.py)
and the CLI (`ortinf transcribe`) alike. Audio is decoded by libsndfile (soundfile: wav, flac, ogg, mp3
and more), mixed to mono and resampled to 16 kHz with soxr; a file that is empty, not audio, or longer
than MAX_AUDIO_SECONDS is a RequestError. Transcripts come in OpenAI's response formats."""

from __future__ import annotations

import io
import re

import numpy as np

from ortinf.errors import RequestError
from ortinf.tasks.speech.audio_features import SAMPLE_RATE

MAX_AUDIO_SECONDS = 3600
FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
BLOCK_FRAMES = 2**16  # frames decoded at a time: the memory of a decode is this block, not the file


def decode_audio(data: bytes) -> np.ndarray:
    """16 kHz mono float32 samples of an audio file's bytes; RequestError (the server's 400) for anything else.

    The file is decoded a block of frames at a time, each block mixed to mono and fed to a streaming
    resampler (its output equals the one-shot resampler's), so that memory follows the 16 kHz mono
    result (at most MAX_AUDIO_SECONDS of it), never the channels x rate of the file: an 8-channel 48 kHz
    hour of compressed silence (1.4 MB of FLAC) was 5.4 GB of float32 decoded whole (issue 30, finding 1)."""
    import soundfile
    import soxr

    if not data:
        raise RequestError("the audio file is empty", param="file")
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as audio:
            # the length is checked before decoding: 25 MB of compressed silence is hours of samples
            if audio.frames / audio.samplerate > MAX_AUDIO_SECONDS:
                raise RequestError(f"the audio is {audio.frames / audio.samplerate:.0f} s long; at most {MAX_AUDIO_SECONDS} s "
                                    "per request", param="file")
            rate = audio.samplerate
            stream = None if rate == SAMPLE_RATE else soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32")
            pieces = []
            for block in audio.blocks(BLOCK_FRAMES, dtype="float32", always_2d=True):
                mono = block.mean(axis=1, dtype=np.float32)
                pieces.append(mono if stream is None else stream.resample_chunk(mono, last=False))
            if stream is not None:
                pieces.append(stream.resample_chunk(np.zeros(0, np.float32), last=True))
    except RequestError:
        raise
    except Exception as exc:  # libsndfile's many refusals are all "not audio we read"
        reason = re.sub(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "the upload", str(exc))[:120] or type(exc).__name__
        raise RequestError(f"the file is not audio this server reads (wav, flac, ogg, mp3): {reason}", param="file") from exc
    samples = np.concatenate(pieces).astype(np.float32, copy=False) if pieces else np.zeros(0, np.float32)
    if samples.size == 0:
        raise RequestError("the audio file holds no samples", param="file")
    return samples


def _within(seconds: float, duration: float) -> float:
    """A time of the transcript: inside the audio, rounded to 10 ms."""
    return round(min(max(seconds, 0.0), duration), 2)


def _clock(seconds: float, separator: str) -> str:
    millis = int(round(seconds * 1000))
    return f"{millis // 3_600_000:02d}:{millis // 60_000 % 60:02d}:{millis // 1000 % 60:02d}{separator}{millis % 1000:03d}"


def transcript(segments: list[tuple[float, float, str]], response_format: str, task: str, duration: float,
               words: list[tuple[str, float, float]] | None = None, details: dict | None = None) -> dict | str:
    """A finished transcription in one of OpenAI's response formats: json and verbose_json as a dict (times
    within the audio, rounded to 10 ms), text, srt and vtt as text. `details`: Transcriber.details (the
    language, each segment's seek, tokens, temperature, avg_logprob, compression_ratio, no_speech_prob)."""
    text = " ".join(s[2] for s in segments if s[2]).strip()
    if response_format == "json":
        return {"text": text}
    if response_format == "text":
        return text
    if response_format == "verbose_json":
        fields = (details or {}).get("segments") or [{}] * len(segments)
        body = {"task": task, "language": (details or {}).get("language"), "duration": round(duration, 2), "text": text,
                "segments": [{"id": i, "seek": extra.get("seek", 0), "start": _within(a, duration), "end": _within(b, duration),
                              "text": t, **{k: v for k, v in extra.items() if k != "seek"}}
                             for i, ((a, b, t), extra) in enumerate(zip(segments, fields))]}
        if words is not None:
            body["words"] = [{"word": w, "start": _within(a, duration), "end": _within(b, duration)} for w, a, b in words]
        return body
    if response_format == "srt":
        return "\n".join(f"{i + 1}\n{_clock(a, ',')} --> {_clock(b, ',')}\n{t}\n" for i, (a, b, t) in enumerate(segments))
    return "WEBVTT\n\n" + "\n".join(f"{_clock(a, '.')} --> {_clock(b, '.')}\n{t}\n" for a, b, t in segments)
