"""Weights as recipes: what a graph's initializer will hold, computed only when it is written.

The streaming exporter (ortinf/exporter/streaming.py) builds its graphs with placeholder initializers
(names, shapes and types, no bytes). Each placeholder has a recipe: a checkpoint tensor (`Source`,
cast to the export dtype, transposed where the graph multiplies by its transpose) or a form derived
from one (`Derived`: the quantizer's MatMulNBits or ortinf.QMatMul tensors). `write` then goes over
the checkpoint tensor by tensor: each is read once, every initializer made from it is computed and
appended to its graph's weights file, and the tensor is dropped before the next is read. One
tensor's working set, whatever the model's depth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
from onnx import TensorProto

LAZY = "ortinf-lazy"  # the external-data location of a placeholder, before it is written
ALIGN = 4096  # offsets in a weights file: page-aligned, so ONNX Runtime may map tensors instead of copying them


@dataclass(frozen=True, slots=True)
class Source:
    """A checkpoint tensor as a graph holds it."""

    name: str  # the checkpoint's tensor name
    dtype: str  # "float32", "float16" or "bfloat16" (numpy_dtype)
    transpose: bool = False


@dataclass(frozen=True, slots=True)
class Derived:
    """A quantized form of a source (ortinf/exporter/quantize.py)."""

    source: Source
    form: str  # "nbits.B" or "nbits.scales"
    bits: int
    block_size: int


@dataclass(frozen=True, slots=True)
class Alias:
    """The bytes of another placeholder under dims of its own (a tied embedding's rows are its LM head's
    MatMulNBits B and scales, [V, blocks, blob] read as [V, blocks * blob]): written once, referenced twice."""

    target: str


Recipe = Source | Derived | Alias


class LazyWeights:
    """The recipes of placeholder initializers, by tensor name (shared by a package's graphs)."""

    def __init__(self) -> None:
        self.recipes: dict[str, Recipe] = {}

    def placeholder(self, name: str, recipe: Recipe, dims: Iterable[int], data_type: int) -> TensorProto:
        """An initializer without bytes, to be filled by `write`."""
        known = self.recipes.setdefault(name, recipe)
        assert known == recipe, f"two recipes for {name}"
        tensor = TensorProto()
        tensor.name = name
        tensor.dims.extend(int(d) for d in dims)
        tensor.data_type = data_type
        tensor.data_location = TensorProto.EXTERNAL
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", LAZY
        return tensor

    def is_lazy(self, tensor: TensorProto) -> bool:
        return tensor.data_location == TensorProto.EXTERNAL and any(e.key == "location" and e.value == LAZY for e in tensor.external_data)


def source_of(recipe: Recipe) -> Source:
    return recipe.source if isinstance(recipe, Derived) else recipe


def numpy_dtype(name: str) -> np.dtype:
    """A recipe's dtype as numpy holds it (bfloat16 is ml_dtypes', as onnx's numpy_helper reads it)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


CHUNK_BYTES = 64 << 20  # checkpoint rows read at once: an LM head of 152k x 3584 is written in pieces of this size


class Reader(Protocol):
    """Where placeholders' sources come from (the checkpoint, ortinf/exporter/streaming.py)."""

    def shape(self, source: Source) -> list[int]:
        """The stored tensor's shape (before the recipe's transpose)."""

    def read(self, source: Source, start: int, stop: int) -> np.ndarray:
        """Rows start:stop of the stored tensor, in the recipe's dtype, not transposed."""


def _nbytes(tensor: TensorProto) -> int:
    return int(np.prod(list(tensor.dims), dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def write(graphs: list[tuple[onnx.ModelProto, Path]], lazy: LazyWeights, reader: Reader,
          derive: Callable[[np.ndarray, Derived, dict], np.ndarray], progress: Callable[[int], None] | None = None) -> None:
    """Fills every placeholder of `graphs` (each with the weights file its new tensors go to), reading each
    checkpoint tensor once, in pieces of about CHUNK_BYTES: rows of the stored tensor, which are the output
    columns N of a weight the graph multiplies by its transpose, so a piece's quantized forms (per column
    and block of K, QMatMul's tiles of 16 columns) are contiguous in the file. A tensor both graphs hold
    (same name) is written once, into the first graph's file. `derive(array, recipe, memo)` computes a
    quantized form of a piece (`memo` lives while one piece is written: the rounding both forms share)."""
    wanted: dict[str, Path] = {}  # tensor name -> file it is written to
    sizes: dict[str, int] = {}
    aliases: dict[str, int] = {}  # an Alias placeholder -> its byte count (its target's)
    for model, data in graphs:
        for tensor in model.graph.initializer:
            if lazy.is_lazy(tensor) and isinstance(lazy.recipes[tensor.name], Alias):
                aliases[tensor.name] = _nbytes(tensor)
            elif lazy.is_lazy(tensor) and tensor.name not in wanted:
                wanted[tensor.name], sizes[tensor.name] = data, _nbytes(tensor)
    placed: dict[str, tuple[Path, int, int]] = {}
    ends: dict[Path, int] = {}
    for name, path in wanted.items():  # the layout first: every tensor's region, page-aligned
        start = -(-ends.get(path, 0) // ALIGN) * ALIGN
        placed[name] = (path, start, sizes[name])
        ends[path] = start + sizes[name]
    groups: dict[Source, list[str]] = {}  # one checkpoint read -> the tensors made from it
    for name in wanted:
        groups.setdefault(source_of(lazy.recipes[name]), []).append(name)
    files, prefetching = {}, None
    try:
        for path, end in ends.items():
            files[path] = open(path, "w+b")  # noqa: SIM115 - closed below
            try:
                files[path].truncate(end)  # sparse: the space is taken as pieces are written
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(path)) from exc
        reads = []
        for source, names in groups.items():
            _, rows, step = _pieces(source, names, lazy, reader)
            reads += [(source, first, min(rows, first + step)) for first in range(0, rows, step)]
        reader = prefetching = Prefetching(reader, reads)
        for source, names in groups.items():
            try:
                _write_group(source, names, lazy, reader, derive, placed, files)
            except OSError as exc:  # a full disk: the CLI's one line names the file (ortinf/cli/exit_codes.py)
                if exc.filename is not None:
                    raise
                raise OSError(exc.errno, exc.strerror, str(placed[names[0]][0])) from exc
            if progress is not None:
                progress(1)
    finally:
        if prefetching is not None:
            prefetching.close()
        for handle in files.values():
            handle.close()
    for name, length in aliases.items():
        target = lazy.recipes[name].target
        assert placed[target][2] == length, f"{name} is {length} bytes, its target {target} {placed[target][2]}"
        placed[name] = placed[target]
    for model, _ in graphs:
        for tensor in model.graph.initializer:
            if tensor.name in placed:
                path, offset, length = placed[tensor.name]
                del tensor.external_data[:]
                for key, value in (("location", path.name), ("offset", str(offset)), ("length", str(length))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value


def _write_group(source: Source, names: list[str], lazy: LazyWeights, reader: Reader,
                 derive: Callable[[np.ndarray, Derived, dict], np.ndarray], placed: dict, files: dict) -> None:
    """Writes the tensors made from one checkpoint tensor, piece by piece."""
    shape, rows, step = _pieces(source, names, lazy, reader)
    recipes = [lazy.recipes[name] for name in names]
    cursors = {name: placed[name][1] for name in names}
    for first in range(0, rows, step):
        piece = reader.read(source, first, min(rows, first + step))
        memo: dict = {}
        for name, recipe in zip(names, recipes):
            path, start, length = placed[name]
            handle = files[path]
            if isinstance(recipe, Source) and recipe.transpose and step < rows:  # columns of the stored [N, K]^T: strided
                view = np.memmap(handle, dtype=numpy_dtype(source.dtype), mode="r+", offset=start, shape=(shape[1], rows))
                view[:, first:first + len(piece)] = piece.T
                view.flush()
                del view
                continue
            if isinstance(recipe, Source):
                value = piece.T if recipe.transpose else piece
            else:
                value = derive(piece.T if recipe.source.transpose else piece, recipe, memo)
            data = memoryview(np.ascontiguousarray(value).reshape(-1).view(np.uint8))  # written from the array: no copy
            handle.seek(cursors[name])
            handle.write(data)
            cursors[name] += len(data)
            del value, data
        del piece, memo
    for name in names:
        if not (isinstance(lazy.recipes[name], Source) and lazy.recipes[name].transpose and step < rows):
            assert cursors[name] == placed[name][1] + placed[name][2], f"{name}: wrote {cursors[name] - placed[name][1]} bytes of {placed[name][2]}"


def _pieces(source: Source, names: list[str], lazy: LazyWeights, reader: Reader) -> tuple[list[int], int, int]:
    """A checkpoint tensor's shape, its rows, and the rows read at once to write the tensors `names` made from it."""
    shape = reader.shape(source)
    rows = shape[0] if shape else 1
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * numpy_dtype(source.dtype).itemsize)
    # quantized forms of a weight stored [K, N] (not transposed) need whole columns: one piece
    whole = len(shape) != 2 or any(isinstance(lazy.recipes[n], Derived) and not lazy.recipes[n].source.transpose for n in names)
    return shape, rows, rows if whole else max(16, CHUNK_BYTES // row_bytes // 16 * 16)  # whole tiles of QMatMul's 16 columns


class Prefetching:
    """A Reader that reads `reads` (source, start, stop), in that order, on a thread of its own, at most `depth` pieces
    ahead: the next piece comes off the disk (and is widened to the recipe's dtype) while this one is quantized and
    written, which release the GIL as reading does. Pieces must be asked for in the planned order."""

    def __init__(self, reader: Reader, reads: list[tuple[Source, int, int]], depth: int = 2) -> None:
        import queue
        import threading

        self.reader = reader
        self.pieces: queue.Queue = queue.Queue(maxsize=depth)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(reads,), name="ortinf-checkpoint-reader", daemon=True)
        self.thread.start()

    def _run(self, reads: list[tuple[Source, int, int]]) -> None:
        import queue

        for key in reads:
            try:
                item: object = self.reader.read(*key)
            except BaseException as exc:  # noqa: BLE001 - handed to the writer, which raises it in its own thread
                item = exc
            while not self.stopped.is_set():
                try:
                    self.pieces.put((key, item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self.stopped.is_set() or isinstance(item, BaseException):
                return

    def shape(self, source: Source) -> list[int]:
        return self.reader.shape(source)

    def read(self, source: Source, start: int, stop: int) -> np.ndarray:
        key, item = self.pieces.get()
        assert key == (source, start, stop), f"read {source.name}[{start}:{stop}] out of the planned order {key}"
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()


def num_groups(graphs: list[onnx.ModelProto], lazy: LazyWeights) -> int:
    """How many checkpoint reads `write` makes (for a progress bar)."""
    return len({source_of(lazy.recipes[t.name]) for m in graphs for t in m.graph.initializer
                if lazy.is_lazy(t) and not isinstance(lazy.recipes[t.name], Alias)})
