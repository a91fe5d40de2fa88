"""Verification in windows of layers: parity and quality within a memory bound that does not grow with depth.

Where a package's layer weights exceed the verification budget (`--verify-memory`, default VERIFY_MEMORY), it is
verified in windows of consecutive layers: each window is the package's own graph cut to the embedding, layers
[first, stop) and the final norm and LM head (`cut`), over a hard link to the same weight file, against the
PyTorch model whose layer list is cut the same way (`reference_window`). The cut is found from the graph (node
names carry the layer's scope); a graph where it is not exactly one tensor is verified whole, with the reason logged.

The design (why, how the cut is found, what windows do not cover): docs/exporter.md, "Windows of layers"."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import onnx
import torch

from ortinf.exporter.config import VERIFY_MEMORY
from ortinf.kernels import library
from ortinf.manifest import Manifest

log = logging.getLogger(__name__)

PER_LAYER = re.compile(r"^(key_cache|value_cache|key_cache_out|value_cache_out|new_key|new_value)\.(\d+)$")
LOGITS = "logits"


class NotWindowable(Exception):  # noqa: N818 - a verdict the caller acts on (verify whole), not a failure
    """The graph's layer boundaries are not one tensor each: verify the package whole."""


@dataclass(frozen=True)
class Window:
    """Layers [first, stop) of a package: `package`, a folder whose graphs hold only them, and `model`, the
    PyTorch reference cut the same way (both valid inside `windows`' loop only)."""

    first: int
    stop: int
    package: Path
    model: torch.nn.Module


def decoder_layers(model: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """The module holding the decoder layer list, and the list's attribute name."""
    base = model.base_model if model.base_model is not model else getattr(model, "model", None)
    if not isinstance(base, torch.nn.Module):
        raise NotWindowable("no decoder body found")
    count = model.config.get_text_config().num_hidden_layers
    for name, child in base.named_children():
        if isinstance(child, torch.nn.ModuleList) and len(child) == count:
            return base, name
    raise NotWindowable("no list of decoder layers found")


def layer_bytes(graph: onnx.GraphProto, layers_name: str) -> list[int]:
    """Each layer's weight bytes in the package's weight file: initializers only that layer's nodes read."""
    owner = _layer_of_nodes(graph, layers_name)
    readers: dict[str, set] = defaultdict(set)
    for node, layer in zip(graph.node, owner):
        for name in node.input:
            readers[name].add(layer)
    sizes: dict[int, int] = defaultdict(int)
    for tensor in graph.initializer:
        layers = readers.get(tensor.name, set())
        if len(layers) == 1 and None not in layers:
            length = {e.key: e.value for e in tensor.external_data}.get("length")
            sizes[next(iter(layers))] += int(length) if length is not None else len(tensor.raw_data)
    count = 1 + max((layer for layer in owner if layer is not None), default=-1)
    return [sizes[layer] for layer in range(count)]


def plan(sizes: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive windows of layers, each within `budget` bytes of layer weights (at least one layer), of equal
    length: one window (the whole model) when every layer fits."""
    if sum(sizes) <= budget:
        return [(0, len(sizes))]
    per_window = max(1, budget // max(1, max(sizes)))
    count = -(-len(sizes) // per_window)
    length = -(-len(sizes) // count)
    return [(first, min(first + length, len(sizes))) for first in range(0, len(sizes), length)]


def _layer_of_nodes(graph: onnx.GraphProto, layers_name: str) -> list[int | None]:
    scope = re.compile(rf"/{re.escape(layers_name)}\.(\d+)/")
    found = [scope.search(node.name) for node in graph.node]
    return [int(m.group(1)) if m else None for m in found]


def cut(model: onnx.ModelProto, first: int, stop: int, layers_name: str) -> onnx.ModelProto:
    """The graph of layers [first, stop): the embedding feeds layer `first`, layer stop-1 feeds the final norm,
    the other layers' nodes, pool inputs/outputs and weights are gone, and the kept layers' pool tensors are
    renumbered from 0. Raises NotWindowable where a boundary is not exactly one tensor."""
    graph = model.graph
    owner = _layer_of_nodes(graph, layers_name)
    num_layers = 1 + max((layer for layer in owner if layer is not None), default=-1)
    if num_layers == 0:
        raise NotWindowable(f"no node is in a /{layers_name}.N/ scope")
    producer = {out: (index, owner[index]) for index, node in enumerate(graph.node) for out in node.output}
    readers: dict[str, list[tuple[int, int]]] = defaultdict(list)  # tensor -> [(node index, input position)]
    for index, node in enumerate(graph.node):
        for position, name in enumerate(node.input):
            readers[name].append((index, position))

    tokens = _from_tokens(graph)

    def layers_reading(name: str) -> set:
        return {owner[index] for index, _ in readers[name]}

    def output_of(layer: int) -> str:
        """The tensor layer `layer` hands to the next one (or, for the last, the one the logits come from)."""
        if layer == num_layers - 1:
            found = {name for name in _frontier(graph, owner, LOGITS) if producer[name][1] == layer and name in tokens}
        else:
            found = {name for node, o in zip(graph.node, owner) if o == layer
                     for name in node.output if name in tokens and layers_reading(name) == {layer + 1}}
        if len(found) != 1:
            raise NotWindowable(f"layer {layer} hands {len(found)} tensors on ({', '.join(sorted(found)[:4])})")
        return found.pop()

    rewire: dict[tuple[int, int], str] = {}  # (node index, input position) -> tensor it reads instead
    if first > 0:
        hidden = output_of(first - 1)
        names = {node.name: index for index, (node, o) in enumerate(zip(graph.node, owner)) if o == 0}
        embedded = set()
        for index, position in readers[hidden]:
            twin = names.get(re.sub(rf"/{re.escape(layers_name)}\.{first}/", f"/{layers_name}.0/", graph.node[index].name))
            if twin is None:
                raise NotWindowable(f"layer 0 has no node named like {graph.node[index].name}")
            embedded.add(graph.node[twin].input[position])
            rewire[(index, position)] = ""
        if len(embedded) != 1 or next(iter(embedded)) in producer and producer[next(iter(embedded))][1] is not None:
            raise NotWindowable(f"layer 0 reads {len(embedded)} tensors where layer {first} reads layer {first - 1}'s output")
        rewire = dict.fromkeys(rewire, embedded.pop())
    if stop < num_layers:
        last = output_of(num_layers - 1)
        kept = output_of(stop - 1)
        for index, position in readers[last]:
            if owner[index] is None:
                rewire[(index, position)] = kept

    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = out.graph.node
    for (index, position), name in rewire.items():
        nodes[index].input[position] = name

    def keep_layer(name: str) -> str | None:
        """A per-layer pool name renumbered into the window, or None for a layer outside it."""
        match = PER_LAYER.match(name)
        if match is None:
            return name
        layer = int(match.group(2))
        return f"{match.group(1)}.{layer - first}" if first <= layer < stop else None

    outputs = [o for o in out.graph.output if keep_layer(o.name) is not None]
    live = {o.name for o in outputs}
    alive = [False] * len(nodes)
    for index in range(len(nodes) - 1, -1, -1):  # the graph is topologically sorted
        if any(name in live for name in nodes[index].output if name):  # "" is an optional output left out, not a tensor
            alive[index] = True
            live.update(name for name in nodes[index].input if name)
    kept_nodes = [node for node, keep in zip(nodes, alive) if keep]
    for node in kept_nodes:
        for position, name in enumerate(node.input):
            node.input[position] = keep_layer(name) or name
        for position, name in enumerate(node.output):
            node.output[position] = keep_layer(name) or name
    inputs = [i for i in out.graph.input if keep_layer(i.name) is not None]
    for value in (*inputs, *outputs):
        value.name = keep_layer(value.name)
    initializers = [t for t in out.graph.initializer if t.name in live]
    for field, values in (("node", kept_nodes), ("input", inputs), ("output", outputs), ("initializer", initializers)):
        out.graph.ClearField(field)
        getattr(out.graph, field).extend(values)
    out.graph.ClearField("value_info")
    return out


def _from_tokens(graph: onnx.GraphProto) -> set[str]:
    """Tensors computed from the token ids (the hidden states, not the step's position and block metadata)."""
    found = {i.name for i in graph.input if i.name == "input_ids" or "embeds" in i.name}
    for node in graph.node:
        if any(name in found for name in node.input):
            found.update(node.output)
    return found


def _frontier(graph: onnx.GraphProto, owner: list[int | None], output: str) -> set[str]:
    """Tensors made by layer nodes that `output` is computed from through non-layer nodes only."""
    producer = {out: index for index, node in enumerate(graph.node) for out in node.output}
    seen, found, todo = set(), set(), [output]
    while todo:
        name = todo.pop()
        if name in seen or name not in producer:
            continue
        seen.add(name)
        index = producer[name]
        if owner[index] is not None:
            found.add(name)
        else:
            todo.extend(graph.node[index].input)
    return found


@contextlib.contextmanager
def reference_window(model: torch.nn.Module, first: int, stop: int) -> Iterator[torch.nn.Module]:
    """`model` computing with its layers [first, stop) only (its modules keep their names: the streaming
    reference reads their weights by them)."""
    base, name = decoder_layers(model)
    layers = getattr(base, name)
    config = model.config.get_text_config()
    count = config.num_hidden_layers
    setattr(base, name, torch.nn.ModuleList(list(layers)[first:stop]))
    config.num_hidden_layers = stop - first
    try:
        yield model
    finally:
        setattr(base, name, layers)
        config.num_hidden_layers = count


def windows(model: torch.nn.Module, package: Path, budget: int = VERIFY_MEMORY) -> Iterator[Window]:
    """The package itself (one window) where its layer weights fit in `budget` or it cannot be cut; else one
    Window per range of layers, each a temporary package beside `package` removed when the loop moves on."""
    manifest = Manifest.load(package)
    graph_files = sorted(p.name for p in package.glob("*.onnx"))
    try:
        _, layers_name = decoder_layers(model)
        if manifest.decoder.lora_targets:
            raise NotWindowable("LoRA inputs are per layer")
        sizes = layer_bytes(onnx.load(str(package / graph_files[0]), load_external_data=False).graph, layers_name)
        ranges = plan(sizes, budget)
        graphs = {} if len(ranges) == 1 else {f: onnx.load(str(package / f), load_external_data=False) for f in graph_files}
        cuts = {f: [cut(g, first, stop, layers_name) for first, stop in ranges] for f, g in graphs.items()}
    except NotWindowable as reason:
        log.warning("%s is verified whole: %s", package.name, reason)
        ranges, cuts = [(0, manifest.decoder.num_layers)], {}
    if len(ranges) == 1:
        yield Window(0, manifest.decoder.num_layers, package, model)
        return
    log.info("verifying %s in %d windows of layers (%s), within %.1f GiB of layer weights each",
             package.name, len(ranges), ", ".join(f"{a}-{b - 1}" for a, b in ranges), budget / 2**30)
    for number, (first, stop) in enumerate(ranges):
        folder = Path(tempfile.mkdtemp(prefix=f".{package.name}.window-", dir=package.parent))
        try:
            for data in package.glob("*.onnx.data"):  # a hard link: ORT refuses external data outside the graph's folder
                os.link(data, folder / data.name)
            for name, graph_cuts in cuts.items():
                onnx.save_model(graph_cuts[number], str(folder / name))
            replace(manifest, decoder=replace(manifest.decoder, num_layers=stop - first)).save(folder)
            with reference_window(model, first, stop) as reference, library.temporary_packages():
                yield Window(first, stop, folder, reference)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

