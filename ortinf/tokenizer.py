"""Loading a package's tokenizer with the `tokenizers` library only (no transformers at serving time)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from ortinf.errors import ConfigError, RequestError


def _special_token(config: dict, key: str) -> str | None:
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def check_unicode(text: str, param: str) -> str:
    """`text`, if it can be written as UTF-8 (JSON's \\ud800 escapes decode to lone surrogates,
    which no tokenizer takes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{param} is not valid Unicode: {exc.reason} at character {exc.start}", param=param) from exc
    return text


def load_tokenizer(package_dir: Path) -> Tokenizer:
    """The package's tokenizer.json; a package exported without one can only take token ids."""
    path = package_dir / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"{package_dir} has no tokenizer.json: pass token ids, or re-export from a folder with a tokenizer")
    return Tokenizer.from_file(str(path))


def load_checked_tokenizer(package_dir: Path, vocab_size: int | None) -> Tokenizer:
    """The package's tokenizer, refused (ConfigError naming both sizes) when its ids do not fit the
    graph's vocabulary: the first such prompt would otherwise fail inside ORT's Gather."""
    return checked_tokenizer(package_dir, vocab_size)[0]


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """What a tokenizer's vocabulary says, read in one pass (get_vocab takes 0.1 s at 152k entries)."""

    size: int  # one more than the largest id it can produce (added tokens included)
    longest: int  # characters in its longest entry


def vocabulary(tokenizer: Tokenizer) -> Vocabulary:
    entries = tokenizer.get_vocab(with_added_tokens=True)
    return Vocabulary(max(entries.values(), default=-1) + 1, max(map(len, entries), default=0))


_VOCABULARIES: dict[tuple[str, int, int], Vocabulary] = {}  # tokenizer.json (path, size, mtime) -> what it says


def checked_tokenizer(package_dir: Path, vocab_size: int | None) -> tuple[Tokenizer, Vocabulary]:
    """load_checked_tokenizer's tokenizer, with its Vocabulary (read once per file and process: `ortinf serve` checks
    every package before it starts, then the engine loads it)."""
    tokenizer = load_tokenizer(package_dir)
    stat = (package_dir / "tokenizer.json").stat()
    key = (str((package_dir / "tokenizer.json").resolve()), stat.st_size, stat.st_mtime_ns)
    facts = _VOCABULARIES.get(key)
    if facts is None:
        facts = _VOCABULARIES[key] = vocabulary(tokenizer)
    if vocab_size is not None and (mismatch := vocab_mismatch(tokenizer, vocab_size, facts)) is not None:
        raise ConfigError(f"{package_dir}: {mismatch}, then re-export the package")
    return tokenizer, facts


def tokenizer_size(tokenizer: Tokenizer) -> int:
    """One more than the largest id the tokenizer can produce (added tokens included)."""
    return vocabulary(tokenizer).size


def vocab_mismatch(tokenizer: Tokenizer, vocab_size: int, facts: Vocabulary | None = None) -> str | None:
    """Why the tokenizer cannot drive a model with `vocab_size` embeddings, or None when it can.

    A model's vocabulary may be larger than its tokenizer (padded embedding tables are common);
    a tokenizer with ids beyond the vocabulary would make the graph's Gather fail on those ids.
    """
    size = (facts or vocabulary(tokenizer)).size
    if size <= vocab_size:
        return None
    return (f"the tokenizer produces ids up to {size - 1} ({size} tokens) but the model's vocabulary has "
            f"{vocab_size}: use the model's own tokenizer")


def pad_token_id(package_dir: Path, tokenizer: Tokenizer) -> int:
    """The pad token's id from tokenizer_config.json, else 0."""
    config_path = package_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    token = _special_token(config, "pad_token")
    token_id = tokenizer.token_to_id(token) if token else None
    return 0 if token_id is None else token_id


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's map from the printable characters ByteLevel tokens are written in back to bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


class TokenBytes:
    """The bytes each token stands for (what OpenAI's logprob `bytes` holds): a byte-level token's own
    bytes, even when it is half of a character that decoding alone would show as U+FFFD."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
        kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", [])}
        self.byte_level = _byte_level_alphabet() if "ByteLevel" in kinds else None
        self.byte_fallback = "ByteFallback" in kinds
        self.metaspace = "Metaspace" in kinds or any(d.get("type") == "Replace" and (d.get("pattern") or {}).get("String") == "\u2581"
                                                       for d in decoder.get("decoders", []))  # Llama's: Replace("▁", " ")

    def __call__(self, token_id: int) -> bytes:
        token = self.tokenizer.id_to_token(token_id)
        if token is None:
            return b""
        if self.byte_level is not None and all(c in self.byte_level for c in token):
            return bytes(self.byte_level[c] for c in token)
        if self.byte_fallback and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            return bytes([int(token[3:5], 16)])
        if self.metaspace:
            return token.replace("\u2581", " ").encode()
        return self.tokenizer.decode([token_id], skip_special_tokens=False).encode()


def bad_words_ids(tokenizer: Tokenizer | None, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
    """Each word's token ids, alone and after a space (vLLM's rule: a word mid-text is usually tokenised with its
    leading space)."""
    if tokenizer is None:
        raise RequestError("bad_words needs the package's tokenizer", param="bad_words")
    found: dict[tuple[int, ...], None] = {}
    for word in words:
        for text in (word, " " + word.lstrip()):
            ids = tuple(tokenizer.encode(check_unicode(text, "bad_words"), add_special_tokens=False).ids)
            if ids:
                found[ids] = None
    return tuple(found)
