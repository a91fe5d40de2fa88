"""Loading a package's tokenizer with the `tokenizers` library only (no transformers at serving time)."""

from __future__ import annotations

import json
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
    tokenizer = load_tokenizer(package_dir)
    if vocab_size is not None and (mismatch := vocab_mismatch(tokenizer, vocab_size)) is not None:
        raise ConfigError(f"{package_dir}: {mismatch}, then re-export the package")
    return tokenizer


def tokenizer_size(tokenizer: Tokenizer) -> int:
    """One more than the largest id the tokenizer can produce (added tokens included)."""
    ids = list(tokenizer.get_vocab(with_added_tokens=True).values())
    return max(ids) + 1 if ids else 0


def vocab_mismatch(tokenizer: Tokenizer, vocab_size: int) -> str | None:
    """Why the tokenizer cannot drive a model with `vocab_size` embeddings, or None when it can.

    A model's vocabulary may be larger than its tokenizer (padded embedding tables are common);
    a tokenizer with ids beyond the vocabulary would make the graph's Gather fail on those ids.
    """
    size = tokenizer_size(tokenizer)
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
