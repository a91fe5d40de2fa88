"""A Hugging Face checkpoint read lazily: one tensor (or a piece of one) at a time from its safetensors shards.

A safetensors file is an 8-byte header length, a JSON header (each tensor's dtype, shape and byte range)
and the tensors' bytes. Reading a tensor here is one positioned read of its byte range (rows start:stop
of it: of theirs only), into memory the caller owns and frees, so nothing else of the checkpoint is
ever resident: what the streaming exporter (ortinf/exporter/streaming.py) needs to convert a 7B model on
a 16 GB machine. (Memory-mapping the shards, as safetensors' own reader does, leaves every page read in
the process's resident set until the file is closed: at the end of an export, the whole checkpoint.)
Names are the checkpoint's own; `resolve` maps a model's parameter name onto them (tied LM heads, and
the key renames transformers applies at load for some classes).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from ortinf.errors import ExportError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
          "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header


@dataclass(frozen=True, slots=True)
class Entry:
    """Where one tensor's bytes are."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    stop: int


class Checkpoint:
    """The tensors of a model folder's safetensors files, by name, read on demand."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.entries: dict[str, Entry] = {}
        index = folder / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ExportError(f"cannot load the weights in {folder}: {INDEX} is unreadable ({exc}); re-download it") from exc
            shards = sorted({str(shard) for shard in weight_map.values()})
            missing = [shard for shard in shards if not (folder / shard).is_file()]
            if missing:
                raise ExportError(f"cannot load the weights in {folder}: the shard {missing[0]} that {INDEX} names is missing"
                                  f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}: re-download the model")
            for shard in shards:
                self.entries.update(_header(folder / shard))
            absent = sorted(name for name in weight_map if name not in self.entries)
            if absent:
                raise ExportError(f"cannot load the weights in {folder}: {absent[0]} is in {INDEX} but not in its shard: "
                                  "re-download the model")
        elif (folder / SINGLE).is_file():
            self.entries.update(_header(folder / SINGLE))

    @classmethod
    def available(cls, folder: Path) -> bool:
        return (folder / INDEX).is_file() or (folder / SINGLE).is_file()

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def names(self) -> Iterable[str]:
        return self.entries.keys()

    def shape(self, name: str) -> list[int]:
        return list(self._entry(name).shape)

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor `name` as stored (its own dtype)."""
        entry = self._entry(name)
        return self.rows(name, 0, entry.shape[0] if entry.shape else 1)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows start:stop of the tensor `name` (all of a 0-d or 1-d one), reading only their bytes."""
        entry = self._entry(name)
        if len(entry.shape) < 2:
            first, last, shape = entry.start, entry.stop, entry.shape
        else:
            stop = min(stop, entry.shape[0])
            row = (entry.stop - entry.start) // entry.shape[0]
            first, last, shape = entry.start + start * row, entry.start + stop * row, (stop - start, *entry.shape[1:])
        data = bytearray(last - first)
        with open(entry.path, "rb") as handle:
            got = handle.readinto(memoryview(data)) if handle.seek(first) == first else 0
        if got != len(data):
            raise ExportError(f"cannot load the weights in {entry.path.parent}: {entry.path.name} is damaged or incomplete "
                              f"(it ends inside {name}): re-download it")
        return torch.frombuffer(data, dtype=entry.dtype).reshape(shape) if data else torch.empty(shape, dtype=entry.dtype)

    def _entry(self, name: str) -> Entry:
        entry = self.entries.get(name)
        if entry is None:
            raise ExportError(f"the checkpoint in {self.folder} has no tensor {name}")
        return entry


def _header(path: Path) -> dict[str, Entry]:
    """The tensors a safetensors file holds, checked against its size (a truncated file is named now)."""
    def damaged(why: str) -> ExportError:
        return ExportError(f"cannot load the weights in {path.parent}: {path.name} is damaged or incomplete ({why}): re-download it")

    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise damaged("no header")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise damaged("its header is larger than the file")
        try:
            header = json.loads(handle.read(length))
        except ValueError as exc:
            raise damaged(f"its header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise damaged("its header is not a table of tensors")
    base, entries = 8 + length, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (first, last) = DTYPES[info["dtype"]], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise damaged(f"{name}'s entry is not readable ({exc})") from exc
        count = 1
        for dim in shape:
            count *= dim
        if last - first != count * dtype.itemsize or base + last > size or first < 0:
            raise damaged(f"it ends inside {name}" if base + last > size else f"{name}'s byte range does not match its shape")
        entries[name] = Entry(path, dtype, shape, base + int(first), base + int(last))
    return entries


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
