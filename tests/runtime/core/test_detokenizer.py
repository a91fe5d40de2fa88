"""Incremental detokenisation: streamed text equals the whole decode (multi-byte characters split across
tokens, leading spaces after the prompt), with tokenizers' DecodeStream and with the window method."""

from __future__ import annotations

import numpy as np
import pytest
from support.tiny_models import add_byte_tokenizer, add_tokenizer
from tokenizers import Tokenizer, decoders

from ortinf.runtime.core.detokenizer import IncrementalDetokenizer
from ortinf.runtime.sample.sampling_params import SamplingParams

TEXTS = ['def f(x):\n    return "héllo wörld 你好" + x', "the quick brown fox, 12 and 345!", "ünïcödé ✓ 🙂 done"]


@pytest.fixture(scope="module", params=["bytes", "metaspace", "llama-decoder"])
def tokenizer(request, tmp_path_factory) -> Tokenizer:
    folder = tmp_path_factory.mktemp(request.param)
    (add_byte_tokenizer if request.param == "bytes" else add_tokenizer)(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    if request.param == "llama-decoder":  # Llama 2's decoder: the marker replaced, byte fallback, a leading space stripped
        tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                               decoders.Strip(" ", 1, 0)])
    return tokenizer


def stream(tokenizer: Tokenizer, prompt: list[int], output: list[int], params: SamplingParams, window: bool) -> tuple[str, list[str]]:
    detok = IncrementalDetokenizer(tokenizer, prompt, params)
    if window:
        detok.stream = None
    seen = []
    for token in output:
        if detok.add_tokens([token]) is not None:
            break
        seen.append(detok.visible_text(False))
    return detok.visible_text(True), seen


@pytest.mark.parametrize("window", [False, True], ids=["DecodeStream", "window"])
def test_streamed_text_equals_the_whole_decode(tokenizer, window):
    for text in TEXTS:
        prompt = tokenizer.encode("prompt: ").ids
        output = tokenizer.encode(text, add_special_tokens=False).ids
        expected = tokenizer.decode(prompt + output)[len(tokenizer.decode(prompt)):]
        final, seen = stream(tokenizer, prompt, output, SamplingParams(), window)
        assert final == expected
        assert all(b.startswith(a) for a, b in zip(seen, seen[1:]))  # text only grows
        assert all("\ufffd" not in s for s in seen) or "\ufffd" in expected


def test_both_methods_agree_on_random_tokens(tokenizer):
    rng = np.random.default_rng(0)
    for _ in range(20):
        output = rng.integers(3, tokenizer.get_vocab_size(), 30).tolist()
        assert stream(tokenizer, [5, 6], output, SamplingParams(), False)[0] == stream(tokenizer, [5, 6], output, SamplingParams(), True)[0]


def test_stop_strings_across_tokens(tokenizer):
    output = tokenizer.encode("the quick brown fox jumps", add_special_tokens=False).ids
    for include in (False, True):
        final, seen = stream(tokenizer, [5], output, SamplingParams(stop=("own f",), include_stop_str_in_output=include), False)
        assert final.endswith("own f" if include else "br") and "own f" not in "".join(seen)


def test_token_bytes_are_the_tokens_own(tokenizer):
    """Concatenated, the bytes of a text's tokens are the text's UTF-8 (a byte-level token may hold half
    of a character: its bytes are still right)."""
    from ortinf.tokenizer import TokenBytes

    token_bytes = TokenBytes(tokenizer)
    text = "the quick brown fox, 12 and 345!"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert b"".join(token_bytes(i) for i in ids).strip() == text.encode()
    if tokenizer.token_to_id("Ã") is not None:  # byte-level: "é" is 0xC3 0xA9, two tokens of one byte each
        ids = tokenizer.encode("é", add_special_tokens=False).ids
        assert b"".join(token_bytes(i) for i in ids) == "é".encode()


def test_a_byte_sequence_decode_stream_refuses_falls_back_to_the_window():
    """A SentencePiece byte-fallback vocabulary (Llama 2's, and every GGUF llama tokenizer transformers converts):
    tokenizers' DecodeStream raises "Invalid prefix" on a lone UTF-8 continuation byte followed by a piece; the
    request goes on with the window method instead of failing."""
    from tokenizers import models

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}, "\u2581t": 259, "\u2581u": 260}
    tokenizer = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), decoders.Replace("\u2581", " "),
                                           decoders.Strip(" ", 1, 0)])
    prompt, output = [3 + 0x18, 3 + 0x2A], [3 + 0xBF, 259, 260]
    if decoders.DecodeStream is not None:  # the failure this guards against, as tokenizers has it here
        raw = decoders.DecodeStream(ids=prompt, skip_special_tokens=True)
        with pytest.raises(Exception, match="Invalid prefix"):
            for token in output:
                raw.step(tokenizer, token)
    detok = IncrementalDetokenizer(tokenizer, prompt, SamplingParams())
    for token in output:
        assert detok.add_tokens([token]) is None
    assert detok.stream is None and detok.text.endswith(" t u")
