"""Finding and reading the model to export: a local folder or a hub id already in the HF cache.

Nothing here downloads: ortinf export works offline, and a missing model is one clear error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortinf.errors import ConfigError, ExportError


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A resolved model folder and its parsed config.json."""

    path: Path
    name: str
    config: dict[str, Any]

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))


def _looks_like_path(model: str) -> bool:
    return model.startswith((".", "/", "~")) or "\\" in model or model.count("/") > 1


def resolve_model(model: str) -> ModelSource:
    """Resolves MODEL to a local folder with a readable config.json, or raises with what to do."""
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ExportError(f"{model} is a file: pass the model's folder (the one holding config.json)")
    elif _looks_like_path(model):
        raise ExportError(f"no such folder: {model}")
    else:
        path = _from_hf_cache(model)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ExportError(f"{path} has no config.json: pass a Hugging Face model folder")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {config_path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{config_path} is not valid JSON (line {exc.lineno}: {exc.msg}); fix or re-download it") from exc
    if not isinstance(config, dict) or "model_type" not in config:
        raise ConfigError(f"{config_path} has no model_type: it is not a transformers config; fix or re-download it")
    return ModelSource(path=path, name=model, config=config)


def _from_hf_cache(repo_id: str) -> Path:
    """The snapshot folder of `repo_id` in the local Hugging Face cache, without any network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except HFValidationError as exc:
        raise ExportError(f"'{repo_id}' is neither a folder nor a valid Hugging Face repo id") from exc
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as exc:
        raise ExportError(
            f"'{repo_id}' is not a local folder and is not in the Hugging Face cache; download it where "
            f"there is network (`huggingface-cli download {repo_id}`) or pass a local folder"
        ) from exc
