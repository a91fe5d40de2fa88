"""Long-form transcription window after window (ortinf/tasks/speech/longform.py, Transcriber.submit_long) against
transformers' own long-form `generate`: timestamps, seeking to the last timestamp pair, windows prompted
with the text so far, the request's prompt, suppressed tokens, temperature fallback and no-speech
skipping, token for token and segment for segment. A tiny random Whisper with Whisper's real timestamp
range (1501 timestamp tokens, 0.00-30.00 s) so that windows seek as the real models do."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from support.tiny_models import build_whisper

import ortinf
import ortinf.tasks.speech.windows as loop_module
from ortinf.tasks.speech.audio_features import SAMPLE_RATE
from ortinf.tasks.speech.longform import Decoding
from ortinf.tasks.speech.transcriber import Transcriber

GENERATION = dict(no_timestamps_token_id=258, prev_sot_token_id=257, eos_token_id=2, decoder_start_token_id=1, pad_token_id=0,
                  suppress_tokens=[3, 4], begin_suppress_tokens=[220, 2], max_initial_timestamp_index=50, is_multilingual=False)


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    root = tmp_path_factory.mktemp("longform")
    model = build_whisper(root / "hf", vocab_size=1760, max_target_positions=96)
    model.generation_config = transformers.GenerationConfig(**GENERATION)
    model.generation_config.save_pretrained(root / "hf")
    ortinf.export(root / "hf", root / "pkg", progress=False)
    assert json.loads((root / "pkg" / "generation_config.json").read_text())["suppress_tokens"] == [3, 4]
    return model, Transcriber(root / "pkg", max_num_seqs=2)


def audio(seconds: float, seed: int) -> np.ndarray:
    """A tone that stops and starts every 7 s, over noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.4 * np.sin(2 * np.pi * (200 + 100 * seed) * t) * (t % 7 < 4) + 0.1 * rng.standard_normal(t.shape)).astype(np.float32)


def hf_segments(model, samples: np.ndarray, **options) -> list[tuple[float, list[int]]]:
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    features = extractor(samples, sampling_rate=SAMPLE_RATE, truncation=len(samples) <= 30 * SAMPLE_RATE,
                         padding="longest" if len(samples) > 30 * SAMPLE_RATE else "max_length", return_attention_mask=True,
                         return_tensors="pt")
    with torch.no_grad():
        out = model.generate(features.input_features, attention_mask=features.attention_mask, return_timestamps=True,
                             return_segments=True, **options)
    return [(round(float(s["start"]), 2), s["tokens"].tolist()) for s in out["segments"][0]]


def ours(transcriber: Transcriber, audios: list[np.ndarray], decoding: Decoding, prompt_ids: list[int] | None = None):
    jobs = [transcriber.submit_long(a, transcriber._prompt(timestamps=True), decoding, prompt_ids=prompt_ids) for a in audios]
    transcriber.drive(jobs)
    assert all(job.error is None for job in jobs)
    return [[(round(s.start, 2), s.tokens) for s in (job.segments[1:] if prompt_ids else job.segments)] for job in jobs]


def test_long_form_with_previous_text_equals_transformers(whisper):
    """Three audios (75 s, 40 s, 9 s) decoded together in two slots; each equals transformers' long-form
    generate of it alone, with condition_on_prev_tokens (for the 9 s audio: its one window)."""
    model, transcriber = whisper
    audios = [audio(75, 1), audio(40, 2), audio(9, 3)]
    got = ours(transcriber, audios, Decoding(max_new_tokens=24, timestamps=True, condition_on_previous_text=True))
    for samples, segments in zip(audios, got):
        expected = hf_segments(model, samples, max_new_tokens=24, condition_on_prev_tokens=True)
        if len(samples) <= 30 * SAMPLE_RATE:  # issue 30, finding 8: transformers seeks on into the padding of an
            expected = [s for s in expected if s[0] < 30]  # audio under 30 s; its first window is all the audio there is
        assert segments == expected
    assert len({start // 30 for start, _ in got[0]}) >= 3  # the 75 s audio really went through several windows
    assert any(tokens[-2] >= 259 and tokens[-1] >= 259 for tokens in (s for _, s in got[0][:-1]))  # windows ended on pairs, and seeked
    plain = ours(transcriber, audios[:1], Decoding(max_new_tokens=24, timestamps=True))[0]
    assert plain == hf_segments(model, audios[0], max_new_tokens=24)


def test_fallback_skip_and_prompt_equal_transformers(whisper, monkeypatch):
    """A request prompt (<|startofprev|> ids), a retry (compression ratio over the threshold, at a second
    greedy temperature: the window keeps its encoder output and prompt K/V) and a window skipped as
    silence (low mean log-probability, <|nospeech|> probable): transformers' result, segment for segment."""
    model, transcriber = whisper
    verdicts = []
    judge = loop_module.judge
    monkeypatch.setattr(loop_module, "judge", lambda *a: verdicts.append(judge(*a)) or verdicts[-1])
    sample = audio(75, 1)
    for options in (dict(compression_ratio_threshold=1.2), dict(logprob_threshold=-5.0, no_speech_threshold=0.0005)):
        verdicts.clear()
        got = ours(transcriber, [sample], Decoding(max_new_tokens=24, timestamps=True, condition_on_previous_text=True,
                                                   temperatures=(0.0, 0.0), **options), prompt_ids=[257, 40, 41])[0]
        assert got == hf_segments(model, sample, max_new_tokens=24, condition_on_prev_tokens=True, temperature=(0.0, 0.0),
                                  prompt_ids=torch.tensor([257, 40, 41]), **options)
        assert ((True, False) if "compression_ratio_threshold" in options else (False, True)) in verdicts, verdicts


def test_sampled_fallback_is_seeded(whisper):
    """Every window fails the (impossible) compression threshold, so each is decoded at every temperature
    and the last, sampled one is kept: seeded, so the same seed gives the same segments."""
    _, transcriber = whisper
    sample = audio(40, 4)
    greedy = ours(transcriber, [sample], Decoding(max_new_tokens=16, timestamps=True))[0]

    def hot(seed: int):
        return ours(transcriber, [sample], Decoding(max_new_tokens=16, timestamps=True, temperatures=(0.0, 0.4, 1.0), seed=seed,
                                                    compression_ratio_threshold=0.01, condition_on_previous_text=True))[0]

    assert hot(3) == hot(3)
    assert any(hot(seed) != greedy for seed in range(4))
    with pytest.raises(ortinf.errors.RequestError, match="logprob_threshold"):
        transcriber.submit_long(sample, [1], Decoding(timestamps=True, no_speech_threshold=0.6))


def test_async_long_form_streams_what_it_keeps(whisper, monkeypatch):
    """Through AsyncTranscriber (the server's path): the timed segments equal the transcriber's own long-form
    run, and a stream yields the text of each kept segment, in order, nothing taken back. (The tiny
    vocabulary leaves no room for a byte tokenizer under the timestamps: a segment's "text" is its ids.)"""
    import asyncio

    from ortinf.runtime.engine.async_engine import AsyncEngine
    from ortinf.tasks.speech.async_transcriber import AsyncTranscriber

    _, transcriber = whisper
    monkeypatch.setattr(transcriber, "_text", lambda ids: " ".join(str(t) for t in ids if t < 258))
    sample = audio(75, 1)
    decoding = Decoding(timestamps=True, condition_on_previous_text=True)
    [job] = transcriber.run([sample], decoding)
    expected = transcriber.segments(job, len(sample) / SAMPLE_RATE)  # (its ends cut at the audio's end)
    runner = AsyncTranscriber(transcriber, AsyncEngine(transcriber.engine), fallback=False)

    async def both():
        streamed = [piece async for piece in runner.stream(sample)]
        segments, _, _ = await runner.transcribe(sample)  # timestamp tokens: window after window
        return streamed, segments

    try:
        streamed, timed = asyncio.run(both())
    finally:
        runner.engine.shutdown()
    assert timed == expected and len(expected) >= 4
    assert streamed == [text for _, _, text in expected] and any(streamed)


def test_long_form_token_times_equal_transformers(whisper):
    """Word timing in long form: each window's kept tokens and their times (seconds into the audio)
    equal the token_timestamps of transformers' long-form segments, joined per window."""
    model, transcriber = whisper
    model.generation_config.alignment_heads = [list(h) for h in transcriber.speech.alignment_heads]
    sample = audio(75, 1)
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    features = extractor(sample, sampling_rate=SAMPLE_RATE, truncation=False, padding="longest", return_attention_mask=True,
                         return_tensors="pt")
    with torch.no_grad():
        out = model.generate(features.input_features, attention_mask=features.attention_mask, return_timestamps=True,
                             condition_on_prev_tokens=True, max_new_tokens=24, return_segments=True, return_token_timestamps=True)
    theirs = [(s["tokens"].tolist(), s["token_timestamps"].tolist()) for s in out["segments"][0]]
    job = transcriber.submit_long(sample, transcriber._prompt(timestamps=True),
                                  Decoding(max_new_tokens=24, timestamps=True, condition_on_previous_text=True, word_timestamps=True))
    transcriber.drive([job])
    ours = [job.timings[i] for i in sorted(job.timings)]
    assert [t for tokens, _ in ours for t in tokens] == [t for tokens, _ in theirs for t in tokens]
    assert np.allclose([x for tokens, times in ours for x in times[: len(tokens)]], [x for _, times in theirs for x in times], atol=1e-6)
    assert len(ours) >= 3


def test_short_audio_ends_at_its_end(whisper, monkeypatch):
    """issue 30, finding 8: audio under 30 s is one window, never decoded past its end (a 1-sample file
    gave segments to 59.4 s, a 3 s file 8 segments to 59.8 s), and no segment reaches past its duration."""
    _, transcriber = whisper
    monkeypatch.setattr(transcriber, "_text", lambda ids: " ".join(str(t) for t in ids if t < 258))
    for samples in (audio(3, 5), np.full(1, 0.1, np.float32)):
        [job] = transcriber.run([samples], Decoding(max_new_tokens=24, timestamps=True))
        assert len(job.results) == 1  # one window
        duration = len(samples) / SAMPLE_RATE
        assert all(start <= end <= duration for start, end, _ in transcriber.segments(job, duration))
