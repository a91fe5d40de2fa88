"""`ortinf transcribe`: audio files through a Whisper package, one line of text per file."""

from __future__ import annotations

from pathlib import Path

import click

from ortinf.cli.serve_options import SPEECH_EXCLUDED, engine_options, engine_values


def transcribe_files(package: Path, files: tuple[Path, ...], output_format: str, language: str | None = None,
                     task: str = "transcribe", temperature: float = 0.0, fallback: bool = True,
                     engine_options: dict | None = None) -> None:
    """Decodes each file (libsndfile), transcribes all of them together, and prints each file's text, or
    its srt/vtt/json, with a progress bar on stderr. The decoding is OpenAI's (ortinf/tasks/speech/longform.py
    openai_decoding): a model with timestamp tokens goes window after window, each prompted with the
    text so far; temperature 0 falls back to hotter ones for windows that repeat or are unlikely."""
    import json

    from tqdm.auto import tqdm

    from ortinf.errors import RequestError
    from ortinf.manifest import Manifest
    from ortinf.tasks.speech.audio_features import SAMPLE_RATE
    from ortinf.tasks.speech.audio_file import transcript
    from ortinf.tasks.speech.longform import openai_decoding
    from ortinf.tasks.speech.transcriber import Transcriber

    if Manifest.load(package).speech is not None and not (Path(package) / "tokenizer.json").is_file():  # before the engine loads
        raise click.UsageError(f"{package} has no tokenizer.json, so it cannot write text: re-export it from a folder with the "
                               "Whisper tokenizer")
    transcriber = Transcriber(package, **(engine_options or {}))  # the one engine's options (EngineConfig's)
    samples = []
    for path in tqdm(files, desc="decoding", disable=len(files) < 2, file=click.get_text_stream("stderr")):
        try:
            samples.append(_decode(path))
        except RequestError as exc:
            raise click.UsageError(f"{path}: {exc}") from exc
    click.echo(f"transcribing {len(files)} file(s), {sum(len(s) for s in samples) / SAMPLE_RATE:.0f} s of audio", err=True)
    decoding = openai_decoding(temperature, transcriber.rules is not None, transcriber.no_speech is not None, fallback)
    try:
        jobs = transcriber.run(samples, decoding, language, task, progress=True)
    except RequestError as exc:
        raise click.UsageError(str(exc)) from exc
    for path, audio, job in zip(files, samples, jobs):
        duration = len(audio) / SAMPLE_RATE
        segments = transcriber.segments(job, duration)
        result = transcript(segments, "json" if output_format == "text" else output_format, task, duration, None,
                            transcriber.details(job, duration))
        if output_format in ("text", "json"):
            click.echo(result["text"] if output_format == "text" else json.dumps({"file": str(path), **result}))
        else:
            click.echo(result)


def _decode(path: Path):
    from ortinf.tasks.speech.audio_file import decode_audio

    return decode_audio(path.read_bytes())


@click.command()
@click.argument("package")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "output_format", type=click.Choice(["text", "json", "srt", "vtt"]), default="text", show_default=True,
              help="What to print per file (srt/vtt: one cue per timestamped segment, or per 30-second window).")
@click.option("--language", default=None, help="The spoken language (e.g. en, de) of a multilingual model [default: detected].")
@click.option("--translate", is_flag=True, help="Translate into English instead of transcribing (multilingual models).")
@click.option("--temperature", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Sampling temperature; 0 is greedy, retried hotter for windows that repeat or are unlikely.")
@click.option("--no-fallback", is_flag=True, help="Decode at --temperature only: no hotter retries, no silence skipping.")
@engine_options(exclude=SPEECH_EXCLUDED)
def transcribe(package: str, files: tuple[Path, ...], output_format: str, language: str | None, translate: bool,
               temperature: float, no_fallback: bool, **engine_given: object) -> None:
    """Transcribe audio FILES (wav, flac, ogg, mp3) with PACKAGE, a Whisper package made by `ortinf export`.

    All files are transcribed together; a model with timestamp tokens goes window after window, each
    prompted with the text so far (openai-whisper's long-form decoding)."""
    from ortinf.bundled import resolve_package

    transcribe_files(resolve_package(package), files, output_format, language, "translate" if translate else "transcribe",
                     temperature, not no_fallback, engine_values(engine_given))
