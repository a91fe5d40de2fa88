"""`ortinf transcribe`: audio files through a Whisper package, one line of text per file."""

from __future__ import annotations

from pathlib import Path

import click


def transcribe_files(package: Path, files: tuple[Path, ...], output_format: str) -> None:
    """Decodes each file (libsndfile), transcribes all of them together (their 30-second windows
    batched), and prints each file's text, or its srt/vtt/json, with a progress bar on stderr."""
    import json

    from tqdm.auto import tqdm

    from ortinf.runtime.transcriber import Transcriber
    from ortinf.serve.audio import SAMPLE_RATE, render
    from ortinf.serve.errors import APIError

    transcriber = Transcriber(package)
    samples = []
    for path in tqdm(files, desc="decoding", disable=len(files) < 2, file=click.get_text_stream("stderr")):
        try:
            samples.append(_decode(path))
        except APIError as exc:
            raise click.UsageError(f"{path}: {exc.message}") from exc
    click.echo(f"transcribing {len(files)} file(s), {sum(len(s) for s in samples) / SAMPLE_RATE:.0f} s of audio", err=True)
    windows = transcriber.transcribe_segments(samples, progress=True)
    size = transcriber.speech.window_samples / SAMPLE_RATE
    for path, audio, texts in zip(files, samples, windows):
        duration = len(audio) / SAMPLE_RATE
        segments = [(i * size, min((i + 1) * size, duration), t) for i, t in enumerate(texts)]
        result = render(segments, "json" if output_format == "text" else output_format, "transcribe", duration)
        if output_format in ("text", "json"):
            click.echo(result["text"] if output_format == "text" else json.dumps({"file": str(path), **result}))
        else:
            click.echo(result.body.decode())


def _decode(path: Path):  # noqa: ANN202
    from ortinf.serve.audio import decode_audio

    return decode_audio(path.read_bytes())
