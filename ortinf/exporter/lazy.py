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

import numpy as np
import onnx
from onnx import TensorProto

LAZY = "ortinf-lazy"  # the external-data location of a placeholder, before it is written
ALIGN = 4096  # offsets in a weights file: page-aligned, so ONNX Runtime may map tensors instead of copying them


@dataclass(frozen=True, slots=True)
class Source:
    """A checkpoint tensor as a graph holds it."""

    name: str  # the checkpoint's tensor name
    dtype: str  # "float32" or "float16"
    transpose: bool = False


@dataclass(frozen=True, slots=True)
class Derived:
    """A quantized form of a source (ortinf/exporter/quantize.py)."""

    source: Source
    form: str  # "nbits.B", "nbits.scales", "qmm.packed", "qmm.scales"
    bits: int
    block_size: int


Recipe = Source | Derived


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


def write(graphs: list[tuple[onnx.ModelProto, Path]], lazy: LazyWeights, load: Callable[[Source], np.ndarray],
          derive: Callable[[np.ndarray, Derived, dict], np.ndarray], progress: Callable[[int], None] | None = None) -> None:
    """Fills every placeholder of `graphs` (each with the weights file its new tensors go to), reading each
    checkpoint tensor once. A tensor both graphs hold (same name) is written once, into the first graph's
    file, and the second graph points there. `derive(array, recipe, memo)` computes a derived form (`memo`
    lives while one source is being written: the quantized weights both forms come from)."""
    wanted: dict[str, Path] = {}  # tensor name -> file it is written to
    for model, data in graphs:
        for tensor in model.graph.initializer:
            if lazy.is_lazy(tensor):
                wanted.setdefault(tensor.name, data)
    groups: dict[Source, list[str]] = {}  # one checkpoint read -> the tensors made from it
    for name in wanted:
        groups.setdefault(source_of(lazy.recipes[name]), []).append(name)
    files: dict[Path, object] = {}
    placed: dict[str, tuple[Path, int, int]] = {}
    try:
        for names in groups.values():
            array = load(source_of(lazy.recipes[names[0]]))
            memo: dict = {}
            for name in names:
                recipe = lazy.recipes[name]
                value = array if isinstance(recipe, Source) else derive(array, recipe, memo)
                path = wanted[name]
                handle = files.get(path)
                if handle is None:
                    handle = files[path] = open(path, "wb")  # noqa: SIM115 - closed below, after every group
                offset = -handle.tell() % ALIGN
                handle.write(b"\0" * offset)
                start = handle.tell()
                data = np.ascontiguousarray(value).tobytes()
                handle.write(data)
                placed[name] = (path, start, len(data))
                del value, data
            del array, memo
            if progress is not None:
                progress(1)
    finally:
        for handle in files.values():
            handle.close()
    for model, _ in graphs:
        for tensor in model.graph.initializer:
            if tensor.name in placed:
                path, offset, length = placed[tensor.name]
                del tensor.external_data[:]
                for key, value in (("location", path.name), ("offset", str(offset)), ("length", str(length))):
                    entry = tensor.external_data.add()
                    entry.key, entry.value = key, value


def num_groups(graphs: list[onnx.ModelProto], lazy: LazyWeights) -> int:
    """How many checkpoint reads `write` makes (for a progress bar)."""
    return len({source_of(lazy.recipes[t.name]) for m in graphs for t in m.graph.initializer if lazy.is_lazy(t)})
