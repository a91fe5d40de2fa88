"""A Hugging Face checkpoint read lazily: one tensor at a time from its safetensors shards.

The shards are memory-mapped (safetensors' `safe_open`), so asking for a tensor reads only its bytes,
and nothing else of the checkpoint is ever resident at once: what the streaming exporter
(ortinf/exporter/streaming.py) needs to convert a 7B model on a 16 GB machine. Names are the
checkpoint's own; `resolve` maps a model's parameter name onto them (tied LM heads, and the key renames
transformers applies at load for some classes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import torch

from ortinf.errors import ExportError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class Checkpoint:
    """The tensors of a model folder's safetensors files, by name, read on demand."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[str, Path] = {}  # tensor name -> shard
        index = folder / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError) as exc:
                raise ExportError(f"cannot load the weights in {folder}: {INDEX} is unreadable ({exc}); re-download it") from exc
            for name, shard in weight_map.items():
                self.files[name] = folder / shard
            missing = sorted({p.name for p in self.files.values() if not p.is_file()})
            if missing:
                raise ExportError(f"cannot load the weights in {folder}: the shard {missing[0]} that {INDEX} names is missing"
                                  f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}: re-download the model")
        elif (folder / SINGLE).is_file():
            for name in _keys(folder / SINGLE):
                self.files[name] = folder / SINGLE
        self._open: dict[Path, object] = {}

    @classmethod
    def available(cls, folder: Path) -> bool:
        return (folder / INDEX).is_file() or (folder / SINGLE).is_file()

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def names(self) -> Iterable[str]:
        return self.files.keys()

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor `name` as stored (its own dtype), read from its shard."""
        path = self.files.get(name)
        if path is None:
            raise ExportError(f"the checkpoint in {self.folder} has no tensor {name}")
        handle = self._open.get(path)
        if handle is None:
            handle = self._open[path] = _safe_open(path)
        try:
            return handle.get_tensor(name)
        except Exception as exc:  # noqa: BLE001 - a truncated or corrupt shard fails in the reader
            raise ExportError(f"cannot load the weights in {path.parent}: {name} in {path.name} is damaged or incomplete "
                              f"({str(exc).splitlines()[0] if str(exc) else exc}): re-download it") from exc

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows start:stop of the tensor `name` (all of a 0-d or 1-d one), reading only their bytes."""
        path = self.files.get(name)
        if path is None:
            raise ExportError(f"the checkpoint in {self.folder} has no tensor {name}")
        handle = self._open.get(path)
        if handle is None:
            handle = self._open[path] = _safe_open(path)
        try:
            part = handle.get_slice(name)
            return part[start:stop] if len(part.get_shape()) >= 2 else part[:]
        except Exception as exc:  # noqa: BLE001 - a truncated or corrupt shard fails in the reader
            raise ExportError(f"cannot load the weights in {path.parent}: {name} in {path.name} is damaged or incomplete "
                              f"({str(exc).splitlines()[0] if str(exc) else exc}): re-download it") from exc

    def shape(self, name: str) -> list[int]:
        path = self.files[name]
        handle = self._open.get(path)
        if handle is None:
            handle = self._open[path] = _safe_open(path)
        return list(handle.get_slice(name).get_shape())

    def close(self) -> None:
        self._open.clear()


def _safe_open(path: Path):  # noqa: ANN202 - safetensors' handle
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # noqa: BLE001 - a truncated header, a missing file
        raise ExportError(f"cannot load the weights in {path.parent}: {path.name} is damaged or incomplete "
                          f"({str(exc).splitlines()[0] if str(exc) else exc}): re-download it") from exc


def _keys(path: Path) -> list[str]:
    handle = _safe_open(path)
    return list(handle.keys())


def resolve(parameter: str, checkpoint: Checkpoint, renames: dict[str, str] | None = None,
            tied: dict[str, str] | None = None) -> str | None:
    """The checkpoint name holding a model parameter: the same name, the name under transformers' load-time
    renames (a class's `_checkpoint_conversion_mapping`, regex -> replacement, applied in reverse), or the
    parameter it is tied to (an LM head saved only as the embedding). None when none of them is there."""
    if parameter in checkpoint:
        return parameter
    for pattern, replacement in (renames or {}).items():  # checkpoint key -> model key; find the key that maps here
        for name in checkpoint.names():
            if re.sub(pattern, replacement, name) == parameter:
                return name
    target = (tied or {}).get(parameter)
    return resolve(target, checkpoint, renames) if target is not None and target != parameter else None
