"""The streaming decoder export: memory that does not grow with the model's depth or vocabulary.

Nothing of the checkpoint is loaded to trace: the model is built empty (parameters on the meta device), layer 0
gets random stand-in weights that every other layer shares, and the wrapper is traced at full depth without
constant folding; the graph is then rebound to per-layer placeholders (ortinf/exporter/rebind.py, lazy.py) that
`lazy.write` fills from the checkpoint one piece at a time. Verification runs against `reference_model`, which
holds one module's weights at a time. Families it does not cover export in memory (api.py), which the log says.

The design (each step, the measurements, what is not streamed and why): docs/exporter.md, "Streaming: memory
that does not grow with the model"."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

from ortinf.errors import ExportError
from ortinf.exporter.checkpoint import Checkpoint, resolve
from ortinf.exporter.lazy import LazyWeights, Source, numpy_dtype
from ortinf.exporter.source import ModelSource

log = logging.getLogger(__name__)

STAND_IN_ROWS = 64  # rows of the embedding and LM head while tracing (the real vocabulary is bound after)
TORCH_TO_ONNX = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16}
NUMPY = {"float32": np.float32, "float16": np.float16}


class NotStreamable(Exception):  # noqa: N818 - a reason, not an error: the caller falls back to the in-memory path
    """Why a model takes the in-memory path."""


@dataclass(slots=True)
class Skeleton:
    """An empty model (parameters on the meta device) and what the streaming export knows of it."""

    model: torch.nn.Module
    layers: torch.nn.ModuleList
    layers_name: str  # the ModuleList's attribute name, as node scopes spell it ("layers", "h")
    layers_prefix: str  # its parameters' prefix ("model.layers")
    checkpoint: Checkpoint
    sources: dict[str, str]  # parameter name -> checkpoint tensor name


def streamable(source: ModelSource, task_model: str, enable_lora: bool, kernel: str) -> str | None:
    """None when `source` exports through this module; else the reason it does not."""
    from ortinf.manifest import PORTABLE

    if not Checkpoint.available(source.path):
        return "its weights are not in safetensors files"
    if enable_lora:
        return "--enable-lora adds inputs per layer"
    if kernel != PORTABLE:
        return f"the {kernel} kernel"
    config = source.config
    if any(key in config for key in ("num_experts", "num_local_experts", "n_routed_experts")):
        return "mixture-of-experts blocks are packed while tracing"
    if task_model != "text-generation":
        return f"a {task_model} model"
    return None


def skeleton(source: ModelSource) -> Skeleton:
    """The model built without weights, its decoder layers found and every parameter mapped to a checkpoint tensor."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(source.path)
    try:
        with parameters_on_meta():
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    except Exception as exc:  # an architecture transformers cannot build from its config
        raise NotStreamable(f"transformers cannot build it empty ({exc})") from exc
    model.eval()
    output, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if getattr(model.config.get_text_config(), "tie_word_embeddings", False) and output is not None and embedding is not None:
        output.weight = embedding.weight  # parameters_on_meta makes a new meta parameter per registration: tie it again
    base = model.base_model if model.base_model is not model else model.model
    layers_name = next((name for name, child in base.named_children()
                        if isinstance(child, torch.nn.ModuleList) and len(child) == config.num_hidden_layers), None)
    if layers_name is None:
        raise NotStreamable("no list of decoder layers found")
    layers = getattr(base, layers_name)
    prefix = next(name for name, module in model.named_modules() if module is layers)
    checkpoint = Checkpoint(source.path)
    renames = getattr(model, "_checkpoint_conversion_mapping", None) or {}
    ties = _ties(model)
    sources = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        found = resolve(name, checkpoint, renames, ties)
        if found is None:
            raise NotStreamable(f"the checkpoint has no tensor for the parameter {name}")
        sources[name] = found
    return Skeleton(model, layers, layers_name, prefix, checkpoint, sources)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built here register their parameters on the meta device (no memory) and their buffers as usual
    (RoPE tables are computed, not loaded): accelerate's init_empty_weights(include_buffers=False), without
    the dependency."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, parameter: torch.nn.Parameter | None) -> None:
        register(module, name, parameter)
        if parameter is not None and not parameter.is_meta:
            kind = type(module._parameters[name])
            module._parameters[name] = kind(module._parameters[name].to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _ties(model: torch.nn.Module) -> dict[str, str]:
    """parameter name -> the first name of the same parameter (tied LM heads)."""
    first: dict[int, str] = {}
    ties = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        owner = first.setdefault(id(parameter), name)
        if owner != name:
            ties[name] = owner
    return ties


def trace_model(skel: Skeleton, dtype: torch.dtype) -> torch.nn.Module:
    """The skeleton made traceable: layer 0 and the rest stand-ins of distinct random values, every layer
    sharing layer 0's parameters, the embedding and LM head of STAND_IN_ROWS rows."""
    model = skel.model
    generator = torch.Generator().manual_seed(0)
    stand_ins: dict[int, torch.nn.Parameter] = {}  # id of a meta parameter -> its stand-in (tied ones stay tied)
    embedding_ids = {id(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None}

    def stand_in(parameter: torch.nn.Parameter) -> torch.nn.Parameter:
        made = stand_ins.get(id(parameter))
        if made is None:
            shape = list(parameter.shape)
            if id(parameter) in embedding_ids:
                shape[0] = min(shape[0], STAND_IN_ROWS)
            values = torch.rand(shape, generator=generator, dtype=torch.float32) + 0.5  # distinct, away from 0
            made = stand_ins[id(parameter)] = torch.nn.Parameter(values.to(dtype), requires_grad=False)
        return made

    shared = {name: stand_in(p) for name, p in skel.layers[0].named_parameters()}
    for index, layer in enumerate(skel.layers):
        for name, parameter in shared.items():
            _set_parameter(layer, name, parameter)
        assert index == 0 or all(p is shared[n] for n, p in layer.named_parameters())
    layer_ids = {id(m) for layer in skel.layers for m in layer.modules()}
    for module in model.modules():
        if id(module) in layer_ids:
            continue
        for name, parameter in list(module._parameters.items()):
            if parameter is not None:
                module._parameters[name] = stand_in(parameter)
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        if module is not None and hasattr(module, "num_embeddings"):
            module.num_embeddings = module.weight.shape[0]
    if any(p.is_meta for p in model.parameters()):
        raise NotStreamable("a parameter was left without a stand-in")
    return model


def _set_parameter(module: torch.nn.Module, dotted: str, parameter: torch.nn.Parameter) -> None:
    owner, _, leaf = dotted.rpartition(".")
    target = module.get_submodule(owner) if owner else module
    target._parameters[leaf] = parameter


@contextlib.contextmanager
def unfolded() -> Iterator[None]:
    """torch.onnx.export without constant folding and without the parameters' values: each parameter is a
    graph input under its own name (folding would merge a shared weight's transpose into one nameless
    constant; values would put the stand-ins in the protobuf). ONNX Runtime folds what constant
    subgraphs are left when it loads the graph."""
    export = torch.onnx.export

    def patched(*args, **kwargs):
        kwargs["do_constant_folding"] = False
        kwargs["export_params"] = False
        return export(*args, **kwargs)

    torch.onnx.export = patched
    try:
        yield
    finally:
        torch.onnx.export = export


def traced_parameter_names(wrapper: torch.nn.Module, model: torch.nn.Module) -> dict[str, str]:
    """The names a trace of `wrapper` gives the model's parameters (the wrapper's first name of each
    parameter object) -> the model's parameter name for that object."""
    by_id = {}
    for name, parameter in model.named_parameters():
        by_id.setdefault(id(parameter), name)
    names = {}
    for name, parameter in wrapper.named_parameters():
        if id(parameter) in by_id:
            names[name] = by_id[id(parameter)]
    return names


class CheckpointReader:
    """lazy.write's reader: pieces of checkpoint tensors in a recipe's dtype (bf16 widened here, by torch)."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint

    def shape(self, source: Source) -> list[int]:
        return self.checkpoint.shape(source.name)

    def read(self, source: Source, start: int, stop: int) -> np.ndarray:
        tensor = self.checkpoint.rows(source.name, start, stop)
        if source.dtype == "bfloat16":  # a bf16 checkpoint's bits as they are; wider ones rounded to nearest even
            return tensor.to(torch.bfloat16).view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
        return tensor.to(torch.float32 if source.dtype == "float32" else torch.float16).numpy()


class _Loaded:
    """Forward hooks that give a module its own parameters from the checkpoint while it runs."""

    def __init__(self, skel: Skeleton) -> None:
        self.skel = skel
        self.names = {id(m): name for name, m in skel.model.named_modules()}

    def before(self, module: torch.nn.Module, *_: object) -> None:
        prefix = self.names[id(module)]
        for leaf, parameter in list(module._parameters.items()):
            if parameter is None:
                continue
            name = f"{prefix}.{leaf}" if prefix else leaf
            values = self.read(self.skel.sources[name])
            module._parameters[leaf] = torch.nn.Parameter(values, requires_grad=False)
            module._ortinf_meta = getattr(module, "_ortinf_meta", {})
            module._ortinf_meta[leaf] = parameter

    def read(self, name: str) -> torch.Tensor:
        """A checkpoint tensor at fp32, widened piece by piece (never a whole bf16 copy beside the fp32 one)."""
        checkpoint = self.skel.checkpoint
        shape = checkpoint.shape(name)
        if len(shape) < 2:
            return checkpoint.tensor(name).to(torch.float32)
        values = torch.empty(shape, dtype=torch.float32)
        step = max(1, (64 << 20) // max(1, values[0].numel() * 4))
        for first in range(0, shape[0], step):
            values[first:first + step] = checkpoint.rows(name, first, first + step)
        return values

    def after(self, module: torch.nn.Module, *_: object) -> None:
        for leaf, parameter in getattr(module, "_ortinf_meta", {}).items():
            module._parameters[leaf] = parameter
        module._ortinf_meta = {}


def reference_model(skel: Skeleton) -> torch.nn.Module:
    """The PyTorch model for verification, holding one module's weights at a time (fp32, from the checkpoint)."""
    loaded = _Loaded(skel)
    for module in skel.model.modules():
        if any(p is not None for p in module._parameters.values()):
            module.register_forward_pre_hook(loaded.before)
            module.register_forward_hook(loaded.after)
    return skel.model


def check_shapes(skel: Skeleton) -> None:
    """Every checkpoint tensor has its parameter's shape (a wrong one fails now, in one line)."""
    for name, parameter in skel.model.named_parameters(remove_duplicate=False):
        shape = skel.checkpoint.shape(skel.sources[name])
        if list(shape) != list(parameter.shape):
            raise ExportError(f"the checkpoint's {skel.sources[name]} has shape {list(shape)} where the config makes "
                              f"{name} {list(parameter.shape)}: the weights do not belong to this config.json")



@dataclass(slots=True)
class Traced:
    """The streaming export's traces: the graphs (weights as placeholders) and the skeleton they came from."""

    skel: Skeleton
    portable: Path
    cpu: Path | None
    names: dict[str, str]  # traced initializer name -> parameter name


def trace(source: ModelSource, spec, trace_dir: Path, dtype: torch.dtype, cpu_spec=None) -> Traced:  # DecoderSpecs
    """Traces the portable graph (and with `cpu_spec` the CPU kernel library's) of a model that shares one layer's weights."""
    from ortinf.exporter.decoder import CPU_PAGED, PagedDecoder, trace_decoder
    from ortinf.manifest import MODEL_NAME

    skel = skeleton(source)
    model = trace_model(skel, dtype)
    names = traced_parameter_names(PagedDecoder(model), model)
    portable = trace_dir / MODEL_NAME
    cpu = None
    with unfolded():
        trace_decoder(model, spec, portable, dtype)
        if cpu_spec is not None:
            cpu = trace_dir / "cpu" / MODEL_NAME
            cpu.parent.mkdir()
            trace_decoder(model, cpu_spec, cpu, dtype, attention=CPU_PAGED)
    return Traced(skel, portable, cpu, names)


def place(traced: Traced, stage: Path, spec, dtype: str, quantization: tuple[int, int] | None,  # a DecoderSpec
          progress: bool) -> tuple[list[str], list[str]]:
    """Writes the package's decoder graphs and their weights, reading the checkpoint one tensor at a time:
    model.host-write.onnx and model.onnx (with the KV write) over model.onnx.data, and model.cpu.onnx over
    the same file. `quantization`: (block size,
    accuracy level) of an int8/int4 export. Returns model.onnx's input and output names."""
    from tqdm.auto import tqdm

    from ortinf.exporter import lazy as lazy_weights
    from ortinf.exporter.bf16 import to_bf16
    from ortinf.exporter.kv_write import add_kv_write, constants_to_initializers
    from ortinf.exporter.quantize import derive_form, quantize
    from ortinf.exporter.rebind import Layout, rebind
    from ortinf.manifest import CPU_MODEL_NAME, HOST_WRITE_MODEL_NAME, MODEL_NAME, WEIGHTS_NAME

    store = "float16" if dtype == "fp16" else "float32"  # the weights' dtype: the traced model's
    skel = traced.skel
    layout = Layout(skel.layers_name, skel.layers_prefix, skel.sources,
                    {name: skel.checkpoint.shape(found) for name, found in skel.sources.items()}, skel.model.config.vocab_size)
    lazy = LazyWeights()
    portable = onnx.load(str(traced.portable), load_external_data=False)
    rebind(portable, layout, traced.names, lazy, store)
    if quantization is not None:
        portable = quantize(portable, dtype, quantization[0], quantization[1], lazy=lazy)
    elif dtype == "bf16":
        portable = to_bf16(portable, lazy)
    host = onnx.ModelProto()
    host.CopyFrom(portable)
    add_kv_write(portable, spec.num_layers, spec.num_kv_heads)
    graphs = [(host, stage / WEIGHTS_NAME), (portable, stage / WEIGHTS_NAME)]
    cpu = None
    if traced.cpu is not None:
        cpu = onnx.load(str(traced.cpu), load_external_data=False)
        rebind(cpu, layout, traced.names, lazy, store)
        constants_to_initializers(cpu)
        if quantization is not None:
            cpu = quantize(cpu, dtype, quantization[0], cpu=True, lazy=lazy)
        elif dtype == "bf16":
            cpu = to_bf16(cpu, lazy, cpu=True)
        add_kv_write(cpu, spec.num_layers, spec.num_kv_heads)
        graphs.append((cpu, stage / WEIGHTS_NAME))  # QMatMul reads MatMulNBits' tensors: one file (quantize.py)
    checkpoint = skel.checkpoint
    total = lazy_weights.num_groups([g for g, _ in graphs], lazy)
    # nested under export's bar: only on a terminal (in a log, a second bar's cursor moves print as "[A")
    with tqdm(total=total, desc="writing", unit="tensor", disable=not progress or not sys.stderr.isatty(), leave=False,
              position=1) as bar:
        lazy_weights.write(graphs, lazy, CheckpointReader(checkpoint), derive_form, bar.update)
    onnx.save_model(host, str(stage / HOST_WRITE_MODEL_NAME))
    onnx.save_model(portable, str(stage / MODEL_NAME))
    if cpu is not None:
        onnx.save_model(cpu, str(stage / CPU_MODEL_NAME))
    initializers = {t.name for t in portable.graph.initializer}
    return [i.name for i in portable.graph.input if i.name not in initializers], [o.name for o in portable.graph.output]
