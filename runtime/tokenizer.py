"""Loading a package's tokenizer with the `tokenizers` library only (no transformers at serving time)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from ortinf.errors import ConfigError


def _special_token(config: dict, key: str) -> str | None:
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_tokenizer(package_dir: Path) -> Tokenizer:
    """The package's tokenizer.json; a package exported without one can only take token ids."""
    path = package_dir / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"{package_dir} has no tokenizer.json: pass token ids, or re-export from a folder with a tokenizer")
    return Tokenizer.from_file(str(path))


def pad_token_id(package_dir: Path, tokenizer: Tokenizer) -> int:
    """The pad token's id from tokenizer_config.json, else 0."""
    config_path = package_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    token = _special_token(config, "pad_token")
    token_id = tokenizer.token_to_id(token) if token else None
    return 0 if token_id is None else token_id
