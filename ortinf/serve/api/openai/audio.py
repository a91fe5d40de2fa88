"""OpenAI's /v1/audio/transcriptions and /v1/audio/translations over a Whisper package (multipart form:
file, model, language, prompt, response_format, temperature, timestamp_granularities[], stream).

Audio is decoded by libsndfile (soundfile: wav, flac, ogg, mp3 and more), mixed to mono and resampled
to 16 kHz with soxr. A file that is empty, not audio, or longer than MAX_AUDIO_SECONDS is a 400.

Decoding is OpenAI's (ortinf/tasks/speech/longform.py openai_decoding): temperature 0 is greedy, retried at 0.2 ...
1.0 for a window that repeats or is unlikely, and a probably silent window is skipped (`ortinf serve
--no-transcription-fallback`: the temperature alone). A model with timestamp tokens (every real
Whisper) goes window after window, each window prompted with the text so far, and its segments are the
model's own timestamps; otherwise the 30-second windows decode side by side and are the segments.
`prompt` goes behind <|startofprev|>. `stream=true` sends a `transcript.text.delta` event per kept
segment (nothing that a retry or seek takes back), then `transcript.text.done`. Word timestamps
(`timestamp_granularities[]=word`, verbose_json) come from the alignment heads (ortinf/tasks/speech/word_timing.py).
The windows of all requests in flight to one model decode together
(ortinf/tasks/speech/async_transcriber.py).
"""

from __future__ import annotations

import asyncio
import math
import time

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import PlainTextResponse, StreamingResponse

from ortinf.serve.errors import APIError
from ortinf.serve.sse import SSE_DONE, sse, sse_error
from ortinf.serve.state import ServerState
from ortinf.serve.streaming import until_disconnected
from ortinf.tasks.speech.audio_features import SAMPLE_RATE
from ortinf.tasks.speech.audio_file import FORMATS, decode_audio, transcript

router = APIRouter()
MAX_AUDIO_BYTES = 25 * 2**20  # OpenAI's upload limit


async def _run(request: Request, task: str, file: UploadFile, model: str | None, language: str | None, prompt: str | None,
               response_format: str, temperature: float, stream: bool, granularities: list[str] | None = None,
               include: list[str] | None = None):
    state: ServerState = request.app.state.ortinf
    if include:
        raise APIError(400, f"include[] ({', '.join(include)[:80]}) is not supported by this server: token logprobs of a "
                            "transcription are not returned; verbose_json gives each segment's avg_logprob", param="include[]")
    served = await state.model(model, request)
    runner = served.require_speech()
    if response_format not in FORMATS:
        raise APIError(400, f"response_format must be one of {', '.join(FORMATS)}", param="response_format")
    if not 0 <= temperature <= 1:
        raise APIError(400, "temperature must be between 0 and 1", param="temperature")
    if stream and response_format not in ("json", "text"):
        raise APIError(400, "stream=true gives text events: response_format must be json or text", param="stream")
    granularities = granularities or []
    if set(granularities) - {"segment", "word"}:
        raise APIError(400, "timestamp_granularities[] takes segment and word", param="timestamp_granularities[]")
    words = "word" in granularities
    if words and (response_format != "verbose_json" or stream):
        raise APIError(400, "word timestamps come in response_format=verbose_json, not streamed", param="timestamp_granularities[]")
    if words and not runner.transcriber.speech.alignment_graph:
        raise APIError(400, "this package has no alignment graph for word timestamps: re-export it with this ortinf",
                       param="timestamp_granularities[]")
    data = await file.read(MAX_AUDIO_BYTES + 1)
    if len(data) > MAX_AUDIO_BYTES:
        raise APIError(413, f"the audio file is larger than {MAX_AUDIO_BYTES} bytes", param="file")
    samples = await asyncio.to_thread(decode_audio, data)
    duration = len(samples) / SAMPLE_RATE
    if stream:
        return _streamed(state, served.name, runner.stream(samples, language, task, temperature, prompt=prompt), duration,
                         runner.transcriber.stats)
    ticket = state.admission.acquire(windows_at_once(state, runner, duration))
    started, failed = time.monotonic(), True
    try:  # windows of concurrent requests decode together; a client gone aborts its windows (finding 9)
        segments, timed_words, details = await until_disconnected(
            request, runner.transcribe(samples, language, task, temperature, prompt=prompt, words=words))
        failed = False
    finally:
        ticket.release()
        state.metrics.observe_transcription(served.name, time.monotonic() - started, duration, failed, runner.transcriber.stats())
    return render(segments, response_format, "transcribe" if task == "transcribe" else "translate", duration,
                  timed_words if words else None, details)


def render(segments: list[tuple[float, float, str]], response_format: str, task: str, duration: float,
           words: list[tuple[str, float, float]] | None = None, details: dict | None = None):
    """The transcript as the route answers it: JSON formats as they are, text formats as text/plain."""
    body = transcript(segments, response_format, task, duration, words, details)
    return PlainTextResponse(body) if isinstance(body, str) else body


def windows_at_once(state: ServerState, runner, duration: float) -> int:
    """Admission tickets for one audio, weighted by its work in flight: window after window (timestamped
    models) is one sequence at a time; fixed windows decode side by side, one sequence each (at most the
    server's capacity: a longer audio waits in the engine's queue rather than being refused)."""
    if runner.transcriber.rules is not None:
        return 1
    return max(1, min(math.ceil(duration / runner.transcriber.window_seconds), state.admission.capacity))


def _streamed(state: ServerState, name: str, pieces, duration: float, stats) -> StreamingResponse:
    """OpenAI's transcription stream: a `transcript.text.delta` event per kept segment (or window), then
    `transcript.text.done` with the whole text; an error after the headers is an error event."""
    ticket = state.admission.acquire(1)

    async def events():
        started, failed, texts = time.monotonic(), True, []
        try:
            async for text in pieces:
                if text:
                    delta = text if not texts else " " + text
                    texts.append(text)
                    yield sse({"type": "transcript.text.delta", "delta": delta})
            yield sse({"type": "transcript.text.done", "text": " ".join(texts)})
            failed = False
        except Exception as exc:  # noqa: BLE001 - reported in the stream, whose headers are already sent
            yield sse_error(exc)
        finally:
            await pieces.aclose()
            ticket.release()
            state.metrics.observe_transcription(name, time.monotonic() - started, duration, failed, stats())
        yield SSE_DONE

    return StreamingResponse(events(), media_type="text/event-stream")


@router.post("/v1/audio/transcriptions", responses={200: {"description": "the transcription, in response_format"}})
async def transcriptions(request: Request, file: UploadFile = File(...), model: str | None = Form(None), language: str | None = Form(None),
                         prompt: str | None = Form(None), response_format: str = Form("json"), temperature: float = Form(0.0),
                         timestamp_granularities: list[str] | None = Form(None, alias="timestamp_granularities[]"),
                         stream: bool = Form(False), include: list[str] | None = Form(None, alias="include[]")):
    return await _run(request, "transcribe", file, model, language, prompt, response_format, temperature, stream,
                      timestamp_granularities, include)


@router.post("/v1/audio/translations", responses={200: {"description": "the English translation, in response_format"}})
async def translations(request: Request, file: UploadFile = File(...), model: str | None = Form(None), prompt: str | None = Form(None),
                       response_format: str = Form("json"), temperature: float = Form(0.0), stream: bool = Form(False)):
    return await _run(request, "translate", file, model, None, prompt, response_format, temperature, stream)
