"""ortinf/tasks/speech/transcriber.py against transformers: a tiny random Whisper (30-second windows, like the real
ones) exported by `ortinf export`, three audios of 3 s, 45 s (two windows) and 1 s decoded together,
greedy token for token against transformers' own greedy loop on each window."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from support.tiny_models import build_whisper

import ortinf
from ortinf.tasks.speech.audio_features import SAMPLE_RATE
from ortinf.tasks.speech.longform import Decoding
from ortinf.tasks.speech.transcriber import Transcriber


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper")
    model = build_whisper(root / "hf")
    ortinf.export(root / "hf", root / "pkg", progress=False)
    return model, root / "pkg"


def audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.4 * np.sin(2 * np.pi * (200 + 100 * seed) * t) + 0.1 * rng.standard_normal(t.shape)).astype(np.float32)


def hf_greedy(model, samples: np.ndarray, prefix: list[int], steps: int, processor=None) -> list[list[int]]:
    """transformers' greedy loop on each 30-second window of `samples` (its feature extractor, its model,
    `processor` applied to the logits as generate would, and the generation config's begin-suppressed
    tokens at the first step as generate does): the tokens after `prefix`, to EOS (2) or `steps`."""
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    windows = []
    for start in range(0, len(samples), 30 * SAMPLE_RATE):
        features = torch.from_numpy(extractor(samples[start : start + 30 * SAMPLE_RATE], sampling_rate=SAMPLE_RATE,
                                              return_tensors="np").input_features)
        ids = list(prefix)
        with torch.no_grad():
            for _ in range(steps):
                logits = model(input_features=features, decoder_input_ids=torch.tensor([ids])).logits[:, -1]
                if len(ids) == len(prefix):
                    logits[:, [t for t in model.generation_config.begin_suppress_tokens or [] if t < logits.shape[-1]]] = -torch.inf
                token = int((processor(torch.tensor([ids]), logits) if processor else logits)[0].argmax())
                if token == 2:
                    break
                ids.append(token)
        windows.append(ids[len(prefix):])
    return windows


def reference(model, samples: np.ndarray, max_new_tokens: int) -> list[int]:
    return [t for window in hf_greedy(model, samples, [1], max_new_tokens) for t in window]


def test_batched_windows_match_transformers_greedy(whisper):
    model, package = whisper
    audios = [audio(3, 0), audio(45, 1), audio(1, 2)]
    transcriber = Transcriber(package, max_num_seqs=2)  # fewer slots than windows: windows wait, then reuse freed blocks
    got = transcriber.transcribe_ids(audios, max_new_tokens=10)
    assert got == [reference(model, a, 10) for a in audios]
    assert all(len(tokens) >= 5 for tokens in got), got  # real decoding, not an immediate end


def test_bad_audio_is_a_request_error(whisper):
    _, package = whisper
    with pytest.raises(ortinf.errors.RequestError, match="non-empty 1-D"):
        Transcriber(package).transcribe_ids([np.zeros(0, np.float32)])


def test_concurrent_requests_decode_together(whisper):
    """AsyncTranscriber on the one engine: the windows of requests in flight at once share decoder calls,
    and each request gets exactly what it gets alone; a request whose step fails fails alone (the text
    engine's one-by-one re-run) while the others finish, and the engine goes on serving (issue 30)."""
    import asyncio
    import time

    from ortinf.runtime.engine.async_engine import AsyncEngine
    from ortinf.runtime.worker.encoder_input import EncoderInput
    from ortinf.tasks.speech.async_transcriber import AsyncTranscriber

    model, package = whisper
    transcriber = Transcriber(package, max_num_seqs=4)
    audios = [audio(3, 0), audio(45, 1), audio(1, 2)]
    alone = [transcriber.transcribe_ids([a])[0] for a in audios]
    engine = transcriber.engine
    widths, released = [], False
    step, execute = engine.step, engine.runner.execute

    def gated():  # the first step waits for every request's windows: the batching asserted is not a race
        nonlocal released
        if not released and len(engine.scheduler.waiting) < 4:
            time.sleep(0.005)
            return []
        released = True
        return step()

    poisoned = EncoderInput.of(transcriber.windows(audio(2, 9))[0], transcriber.source_positions, "audio").digest

    def recorded(scheduler_output):
        widths.append(len(scheduler_output.scheduled))
        if any(s.encoder_input is not None and s.encoder_input.digest == poisoned for s in scheduler_output.scheduled):
            raise RuntimeError("injected fault")
        return execute(scheduler_output)

    engine.step, engine.runner.execute = gated, recorded
    transcriber._text = lambda ids: ids  # token ids, to compare (the tiny model has no tokenizer)
    runner = AsyncTranscriber(transcriber, AsyncEngine(engine), fallback=False)  # greedy alone, to compare with transcribe_ids

    async def windows(sample):  # each window's text (here its ids), through the server's path: no timestamp tokens here
        segments, _, _ = await runner.transcribe(sample)
        return [text for _, _, text in segments]

    async def main(samples):
        return await asyncio.gather(*(windows(a) for a in samples), return_exceptions=True)

    results = asyncio.run(main(audios))
    assert [[t for window in r for t in window] for r in results] == alone
    assert max(widths) == 4  # the windows of all three requests in one decoder call
    mixed = asyncio.run(main([audios[0], audio(2, 9), audios[2]]))
    assert isinstance(mixed[1], ortinf.errors.StepFailedError) and "injected" in str(mixed[1])
    assert [[t for w in r for t in w] for r in (mixed[0], mixed[2])] == [alone[0], alone[2]]
    assert runner.engine.is_alive and engine.kv_cache.usage() == 0.0
    runner.engine.shutdown()


def test_multilingual_prompt_and_language_detection(whisper, tmp_path):
    """A multilingual generation config: with a language, the prompt is start, language, task,
    no-timestamps; without one, each window's language is the likeliest language token after the
    start token (Whisper's detection), then decoding goes on, token for token as transformers does."""
    import json
    import shutil

    model, package = whisper
    multi = tmp_path / "multi"
    shutil.copytree(package, multi)
    generation = {"is_multilingual": True, "lang_to_id": {"<|en|>": 250, "<|de|>": 251, "<|fr|>": 252},
                  "task_to_id": {"transcribe": 253, "translate": 254}, "no_timestamps_token_id": 255, "eos_token_id": 2}
    (multi / "generation_config.json").write_text(json.dumps(generation))
    transcriber = Transcriber(multi, max_num_seqs=2)
    sample = audio(4, 3)
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    features = torch.from_numpy(extractor(sample, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features)

    assert transcriber._prompt("de") == [1, 251, 253, 255]
    with pytest.raises(ortinf.errors.RequestError, match="unknown language"):
        transcriber._prompt("xx")
    with torch.no_grad():
        first = model(input_features=features, decoder_input_ids=torch.tensor([[1]])).logits[0, -1]
    detected = [250, 251, 252][int(first[[250, 251, 252]].argmax())]
    job = transcriber.submit(transcriber.windows(sample), transcriber._prompt(), max_new_tokens=8)
    transcriber.drive([job])
    assert job.results == hf_greedy(model, sample, [1, detected, 253, 255], 8)


def test_sampling_at_a_temperature_is_seeded(whisper):
    _, package = whisper
    transcriber = Transcriber(package, max_num_seqs=2)
    windows = transcriber.windows(audio(2, 5))

    def run(temperature: float, seed: int | None) -> list[int]:
        job = transcriber.submit(windows, transcriber.prompt, max_new_tokens=12, temperature=temperature, seed=seed)
        transcriber.drive([job])
        return job.results[0]

    greedy = run(0.0, None)
    assert run(2.0, 7) == run(2.0, 7)  # the same seed, the same tokens
    assert any(run(2.0, seed) != greedy for seed in range(5))  # sampling really samples
    with pytest.raises(ortinf.errors.RequestError, match="temperature"):
        transcriber.submit(windows, transcriber.prompt, temperature=3.0)


def test_a_prompt_goes_behind_startofprev(whisper, tmp_path):
    """OpenAI's `prompt`: <|startofprev|>, the prompt's tokens, then the forced start, as transformers'
    prompt_ids; the output is only what follows, token for token against transformers."""
    import json
    import shutil

    from support.tiny_models import add_byte_tokenizer

    model, package = whisper
    folder = tmp_path / "prompted"
    shutil.copytree(package, folder)
    add_byte_tokenizer(folder, 384)  # its ids run past the tiny vocabulary: the test uses short prompts of low ids
    (folder / "generation_config.json").write_text(json.dumps({"prev_sot_token_id": 200, "eos_token_id": 2}))
    transcriber = Transcriber(folder, max_num_seqs=2)
    prompt = transcriber._prompt(text="ab")
    ids = transcriber.tokenizer.encode(" ab", add_special_tokens=False).ids
    assert prompt == [200, *ids, 1] and max(ids) < 256
    sample = audio(2, 4)
    job = transcriber.submit(transcriber.windows(sample), prompt, max_new_tokens=6)
    transcriber.drive([job])
    assert job.results == hf_greedy(model, sample, prompt, 6)
    plain = Transcriber(package)
    with pytest.raises(ortinf.errors.RequestError, match="prompt"):
        plain._prompt(text="hello")


def test_timestamp_tokens_against_transformers(whisper, tmp_path):
    """Timestamps on: the prompt has no <|notimestamps|>, each step's logits go through the timestamp
    rules, and the tokens equal transformers' greedy loop with its WhisperTimeStampLogitsProcessor."""
    import json
    import shutil

    from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

    model, package = whisper
    folder = tmp_path / "timestamps"
    shutil.copytree(package, folder)
    (folder / "generation_config.json").write_text(json.dumps({"no_timestamps_token_id": 200, "eos_token_id": 2}))
    transcriber = Transcriber(folder, max_num_seqs=2)
    assert transcriber._prompt() == [1, 200] and transcriber._prompt(timestamps=True) == [1]
    sample = audio(40, 6)  # two windows
    job = transcriber.submit(transcriber.windows(sample), transcriber._prompt(timestamps=True), max_new_tokens=12, timestamps=True)
    transcriber.drive([job])
    processor = WhisperTimeStampLogitsProcessor(transformers.GenerationConfig(no_timestamps_token_id=200, eos_token_id=2), begin_index=1)
    assert job.results == hf_greedy(model, sample, [1], 12, processor)
    assert all(tokens and tokens[0] >= 201 for tokens in job.results)  # each window opens with a timestamp
    with pytest.raises(ortinf.errors.RequestError, match="timestamp"):
        Transcriber(package)._prompt(timestamps=True)


def test_preemption_and_audio_prefix_hits(whisper):
    """A pool too small for the windows admitted: the latest admitted window goes back to the queue, is
    readmitted and recomputes from what the pool still holds, and every window's tokens still equal
    transformers'. The same audio again finds its encoder output in the pool (no encoder call)."""
    model, package = whisper
    audios = [audio(3, 0), audio(45, 1), audio(1, 2)]
    expected = [reference(model, a, 40) for a in audios]
    # 94 cross + 1 self block for each of 3 windows, and 5 spare: 3 windows start, and as their 41 tokens
    # need 3 self blocks each, the latest is preempted; readmitted, it finds its audio's K/V and its
    # first two self blocks still in the pool (every window decodes 40 tokens: the lengths are fixed)
    transcriber = Transcriber(package, max_num_seqs=4, num_blocks=3 * 95 + 5)
    assert transcriber.transcribe_ids(audios, max_new_tokens=40) == expected
    engine = transcriber.engine  # the text engine's scheduler, KV cache manager and counters
    assert engine.scheduler.stats.num_preemptions >= 1 and engine.runner.encoder.num_encoded == 4
    assert engine.kv_cache.num_cross_hits >= 1 and engine.kv_cache.stats.num_hits >= 16
    engine.check_invariants()
    assert engine.kv_cache.usage() == 0.0  # everything given back
    encoded = engine.runner.encoder.num_encoded
    assert transcriber.transcribe_ids(audios[2:], max_new_tokens=40) == expected[2:]
    assert engine.runner.encoder.num_encoded == encoded and engine.kv_cache.num_cross_hits >= 2
    with pytest.raises(ortinf.errors.ConfigError, match="encoder's 1500 positions"):
        Transcriber(package, num_blocks=50)


def test_token_times_equal_transformers_token_timestamps(whisper):
    """Word timing: the alignment graph over a kept window's tokens and its cross K/V (the host encoder's,
    computed again for the kept window), then DTW, gives transformers' generate(return_token_timestamps=True) times, token for
    token (here, two audios of different lengths: the attention is cut to each one's real frames)."""
    model, package = whisper
    transcriber = Transcriber(package, max_num_seqs=2)
    model.generation_config.alignment_heads = [list(h) for h in transcriber.speech.alignment_heads]
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    for sample in (audio(12, 7), audio(5, 3)):
        features = extractor(sample, sampling_rate=SAMPLE_RATE, return_attention_mask=True, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(features.input_features, attention_mask=features.attention_mask, return_token_timestamps=True,
                                 max_new_tokens=20, return_dict_in_generate=True)
        tokens, times = out["sequences"][0, 1:].tolist(), out["token_timestamps"][0, 1:].tolist()
        job = transcriber.submit(transcriber.windows(sample), transcriber.prompt, frames=transcriber.window_frames(sample),
                                 decoding=Decoding(max_new_tokens=20, word_timestamps=True))
        transcriber.drive([job])
        ours, our_times = job.timings[0]
        assert ours == [t for t in tokens if t != 2]
        assert np.allclose(our_times[: len(times)], times, atol=1e-6), (our_times, times)
        assert len(set(times)) >= 4  # the path really moves through the audio
