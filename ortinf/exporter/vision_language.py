"""Vision-language models (issue 33): the frame every family shares; what differs is the family's record
(ortinf/exporter/vision/, one file per family). A package is the language model's ordinary decoder
package (every graph, dtype, kernel and check of a text decoder) plus:

    vision.onnx   pixel_values [N, 3, H, W] -> image_embeds [N, tokens_per_image, hidden]
                  (the vision tower, its feature layer and selection, the projector)
    two more inputs on every decoder graph: image_embeds [M, hidden] and image_rows [M] (int64)

Why an embedding-merge input rather than an `inputs_embeds` path: the graph still takes `input_ids`, so a
text-only step feeds M = 0 and nothing else changes (prefix-cache keys, speculation, LoRA, the CPU kernel
graph); a step whose chunks cover image positions feeds those positions' embeddings and their rows in the
step's flat tokens, and the graph writes them over the token embeddings (ScatterND), exactly where
transformers' LLaVA writes its image features into `inputs_embeds`. The merge is added to each traced
graph after export (`add_image_inputs`), after the embedding lookup (and after a family's embedding scale).

The language model is exported from a temporary Hugging Face folder holding the text model alone
(LlavaForConditionalGeneration's language_model and lm_head), so quantization, the quality gate, the CPU
kernel graph and verification are the text decoder's; the image path is verified here against
transformers' model on a prompt with the family's example image.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from ortinf.errors import ExportError
from ortinf.exporter.config import ExportConfig
from ortinf.exporter.decoder import IMAGE_SPANS_ATTRIBUTE
from ortinf.exporter.tracing import quiet_tracing
from ortinf.exporter.vision import BY_MODEL_TYPE, VisionFamily
from ortinf.exporter.vision.family import IMAGE_EMBEDS, IMAGE_ROWS
from ortinf.manifest import (
    ATTEND_UNTIL,
    CPU_MODEL_NAME,
    HOST_WRITE_MODEL_NAME,
    MODEL_NAME,
    MROPE_DELTAS,
    PORTABLE,
    VISION_CPU_MODEL_NAME,
    VISION_MODEL_NAME,
    Manifest,
    VisionSpec,
)

log = logging.getLogger(__name__)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json", "tokenizer.model", "added_tokens.json")


def text_folder(family: VisionFamily, model: torch.nn.Module, source: Path, folder: Path) -> Path:
    """The language model alone as a Hugging Face folder (and the source's tokenizer files)."""
    import transformers

    config = family.text_config(model)
    if family.image_spans:  # its prefill's image tokens see their whole image (token_type_ids' mask)
        setattr(config, IMAGE_SPANS_ATTRIBUTE, True)
    text = transformers.AutoModelForCausalLM.from_config(config)
    language = family.language_model(model)
    state = {f"model.{k}": v for k, v in language.state_dict().items()}
    state["lm_head.weight"] = model.lm_head.weight
    missing, unexpected = text.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith("rotary_emb.inv_freq")]:
        raise ExportError(f"the language model's weights do not map onto {type(text).__name__}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    text.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, folder / name)
    return folder


def embedding_output(graph: onnx.GraphProto, gather: onnx.NodeProto) -> str:
    """The token embeddings as the layers take them: the lookup's output, or its product with a constant scale (Gemma's
    sqrt(hidden), which transformers applies before writing image features: they are not scaled)."""
    constants = {t.name for t in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"}
    consumers = [n for n in graph.node if gather.output[0] in n.input]
    if len(consumers) == 1 and consumers[0].op_type == "Mul" and any(i in constants for i in consumers[0].input if i != gather.output[0]):
        return consumers[0].output[0]
    return gather.output[0]


def embedding_gather(graph: onnx.GraphProto, hidden: int) -> onnx.NodeProto:
    """The token embedding lookup: the Gather of an initializer [vocab, hidden] by input_ids (or input_ids unsqueezed),
    or in a quantized package the GatherBlockQuantized of its rows (ortinf/exporter/quantize.py)."""
    from ortinf.exporter.quantize import token_ids

    weights = {t.name: t for t in graph.initializer}
    sources = token_ids(graph)
    for node in graph.node:
        table = weights.get(node.input[0]) if node.op_type in ("Gather", "GatherBlockQuantized") else None
        width = table is not None and (table.dims[-1] == hidden or node.op_type == "GatherBlockQuantized")
        if table is not None and len(table.dims) == 2 and width and node.input[1] in sources:
            return node
    raise ExportError("the decoder graph has no token-embedding lookup to merge image embeddings into")


def add_image_inputs(path: Path, hidden: int) -> None:
    """Adds image_embeds / image_rows to a decoder graph and writes them over the token embeddings at those rows
    (graph surgery: the weights stay where they are, in the shared external data)."""
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    gather = embedding_gather(graph, hidden)
    table = next(t for t in graph.initializer if t.name == gather.input[0])
    out = embedding_output(graph, gather)
    anchor = next(n for n in graph.node if out in n.output)
    consumers = [n for n in graph.node if out in n.input]
    names = {k: f"ortinf_image_merge.{k}" for k in ("shape", "flat_shape", "flat", "axes", "rows", "merged", "out")}
    graph.initializer.extend([helper.make_tensor(names["flat_shape"], TensorProto.INT64, [2], [-1, hidden]),
                              helper.make_tensor(names["axes"], TensorProto.INT64, [1], [1])])
    merge = [
        helper.make_node("Shape", [out], [names["shape"]]),
        helper.make_node("Reshape", [out, names["flat_shape"]], [names["flat"]]),
        helper.make_node("Unsqueeze", [IMAGE_ROWS, names["axes"]], [names["rows"]]),
        helper.make_node("ScatterND", [names["flat"], names["rows"], IMAGE_EMBEDS], [names["merged"]]),
        helper.make_node("Reshape", [names["merged"], names["shape"]], [names["out"]]),
    ]
    for node in consumers:
        node.input[:] = [names["out"] if name == out else name for name in node.input]
    index = list(graph.node).index(anchor) + 1
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes[:index] + merge + nodes[index:])
    dtype = TensorProto.FLOAT if gather.op_type == "GatherBlockQuantized" else table.data_type  # the rows it gives
    graph.input.extend([helper.make_tensor_value_info(IMAGE_EMBEDS, dtype, ["num_image_tokens", hidden]),
                        helper.make_tensor_value_info(IMAGE_ROWS, TensorProto.INT64, ["num_image_tokens"])])
    onnx.save_model(model, str(path))


def export_vision_language(source, out_path: Path, export_text, options: ExportConfig) -> Manifest:
    """A LLaVA package: the language model through the text decoder export (`export_text`: ortinf.exporter.api.export,
    with the same `options`), then the image inputs, vision.onnx and their verification."""
    overwrite, tolerance, vision_dtype = options.overwrite, options.tolerance, options.vision_dtype
    import transformers

    from ortinf.exporter.package import staging

    family = BY_MODEL_TYPE[source.model_type]
    architecture = family.classes[source.model_type]
    try:
        model = getattr(transformers, architecture).from_pretrained(source.path, dtype=torch.float32).eval()
    except Exception as exc:  # user-facing
        raise ExportError(f"cannot load {source.name}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}") from exc
    config = model.config
    hidden = config.text_config.hidden_size
    if family.image_spans and options.kernel != PORTABLE:  # bidirectional image attention
        raise ExportError(f"{family.title}'s image tokens attend both ways, which the portable kernel and ortinf's CPU kernel "
                          "draw: drop --kernel")
    with tempfile.TemporaryDirectory(prefix="ortinf-vlm-") as tmp, family.quiet():
        text = text_folder(family, model, Path(source.path), Path(tmp) / "text")
        manifest = export_text(text, Path(tmp) / "pkg", dataclasses.replace(options, task="text-generation", overwrite=True,
                                                                            vision_dtype="fp32"))
        package = Path(tmp) / "pkg"
        graphs = [name for name in (MODEL_NAME, HOST_WRITE_MODEL_NAME, CPU_MODEL_NAME) if (package / name).is_file()]
        for name in graphs:
            add_image_inputs(package / name, hidden)
        with torch.no_grad(), quiet_tracing():
            family.trace(model, package / VISION_MODEL_NAME)
        vision = family.spec(model, Path(source.path))
        if vision_dtype != "fp32":
            vision = quantize_vision(family, package / VISION_MODEL_NAME, vision, vision_dtype, model, options)
        worst = check_image_path(family, model, package, vision)
        exact = manifest.dtype == "fp32" and vision_dtype == "fp32"
        limit = tolerance if tolerance is not None and exact else (1e-3 if exact else float("inf"))
        if not worst <= limit:
            raise ExportError(f"verification failed: with an image, the package's logits differ from transformers' "
                              f"{architecture} by {worst:.3g}, "
                              f"above {limit:g}; nothing was written")
        manifest = dataclasses.replace(manifest, architecture=architecture, model_type=source.model_type,
                                       inputs=(*manifest.inputs, IMAGE_EMBEDS, IMAGE_ROWS), vision=dataclasses.replace(vision, max_abs_diff=worst),
                                       source=str(source.name))
        manifest.save(package)
        with staging(out_path, overwrite) as stage:
            for item in package.iterdir():
                shutil.move(str(item), stage / item.name)
    return manifest


# Least cosine similarity of a quantized tower's image embeddings to fp32's, per embedding row, over random inputs. Measured
# on the tests' tiny random towers (2-3 layers, 32 wide; block sizes 128 / 32): int8 0.99984-0.99995 (LLaVA, Qwen2.5-VL,
# Gemma 3, Idefics3), int4 0.983-0.994; a broken quantization gives ~0.
VISION_COSINE = {"int8": 0.99, "int4": 0.9}


def quantize_vision(family: VisionFamily, path: Path, vision: VisionSpec, dtype: str, model: torch.nn.Module,
                    config: ExportConfig) -> VisionSpec:
    """vision.onnx with its MatMul weights at `dtype` (MatMulNBits, ortinf/exporter/quantize.py), gated by the cosine
    similarity of its embeddings to the fp32 graph's on random inputs (--quality-gate record keeps a miss)."""
    import onnxruntime

    from ortinf.exporter.quantize import quantize
    from ortinf.kernels import library

    fp32 = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    source = onnx.load(str(path))
    graphs = {path: quantize(copy.deepcopy(source), dtype, config.quant_block_size, config.accuracy_level)}
    kernels = library.load()
    if kernels is not None:  # and the kernel library's QMatMul graph: 1.6x faster than fp32 where MatMulNBits is 1.2x (400M tower)
        graphs[path.parent / VISION_CPU_MODEL_NAME] = quantize(copy.deepcopy(source), dtype, config.quant_block_size, cpu=True)
    worst = 1.0
    for target, graph in graphs.items():
        onnx.save_model(graph, str(target))
        session_options = onnxruntime.SessionOptions()
        if target.name == VISION_CPU_MODEL_NAME:
            session_options.register_custom_ops_library(str(kernels.path))
        quantized = onnxruntime.InferenceSession(str(target), session_options, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(7)
        for _ in range(2):
            feeds = family.random_feeds(model, vision, rng)
            feeds = {i.name: feeds[i.name] for i in fp32.get_inputs()}
            (a, *_), (b, *_) = fp32.run(None, feeds), quantized.run(None, feeds)
            a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
            norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
            cosine = np.where(norms > 0, (a * b).sum(-1) / np.maximum(norms, 1e-30), 1.0)  # two zero rows agree
            worst = min(worst, float(cosine.min()))
    if not worst >= VISION_COSINE[dtype]:
        message = (f"the {dtype} vision tower's image embeddings reach a cosine similarity of {worst:.4f} to fp32's, below "
                   f"{VISION_COSINE[dtype]}")
        if config.quality_gate == "enforce":
            raise ExportError(f"verification failed: {message}; nothing was written. Export the tower at a wider --vision-dtype, "
                              "or --quality-gate record to keep the package with its figures")
        log.warning("quality gate not met, recorded and not enforced (--quality-gate record): %s", message)
    return dataclasses.replace(vision, dtype=dtype, embedding_cosine=worst, cpu_graph=VISION_CPU_MODEL_NAME if kernels is not None else "")


def check_image_path(family: VisionFamily, model: torch.nn.Module, package: Path, vision: VisionSpec) -> float:
    """The package's logits (host-write graph, one prefill of a prompt holding an image, then one decode step)
    against transformers' model on the same ids and pixels: the max abs difference. The image's embeddings come from
    the runtime's own VisionEncoder (its batching, window order, tile packing and placement), so the check covers them."""
    import onnxruntime

    from ortinf.providers.registry import resolve
    from ortinf.runtime.worker.image_spans import attend_until
    from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input
    from ortinf.runtime.worker.mrope import rope_deltas
    from ortinf.runtime.worker.vision_encoder import VisionEncoder

    manifest = dataclasses.replace(Manifest.load(package), vision=vision)
    spec = manifest.decoder
    rng = np.random.default_rng(5)
    encoder = VisionEncoder(package, manifest, resolve("cpu"), 0, np.dtype(np.float32))
    image_id = vision.image_token_id
    ids, inputs, placed = family.example(model, vision, rng)
    encoder.prepare([placed])
    specials = {image_id, getattr(model.config, "vision_start_token_id", None), getattr(model.config, "vision_end_token_id", None),
                *vision.image_prefix_ids, *vision.image_suffix_ids}
    ids = [t if t in specials else t % spec.vocab_size for t in ids]
    session = onnxruntime.InferenceSession(str(package / HOST_WRITE_MODEL_NAME), providers=["CPUExecutionProvider"])
    block_size = 4
    blocks = -(-(len(ids) + 2) // block_size)
    row = spec.head_dim
    pools = [np.zeros((spec.num_kv_heads, blocks, block_size, row), np.float16 if spec.kv_dtype == "fp16" else np.float32)
             for _ in range(2 * spec.num_layers)]
    table = list(range(blocks))
    worst = 0.0
    tokens, done = list(ids), 0
    for _ in range(2):
        step = build_model_input([SequenceChunk(tokens[done:], done, table)], block_size)
        feeds = {k: v for k, v in step.feeds().items() if k != "slot_mapping"}
        feeds[IMAGE_EMBEDS], feeds[IMAGE_ROWS] = encoder.chunk([placed], done, len(tokens))
        if spec.mrope_section:
            feeds[MROPE_DELTAS] = rope_deltas([placed], done, len(tokens))
        if spec.image_spans:
            feeds[ATTEND_UNTIL] = attend_until([placed], done, len(tokens))
        feeds.update({f"{kind}_cache.{i}": pools[2 * i + (kind == "value")] for i in range(spec.num_layers) for kind in ("key", "value")})
        logits, *new_kv = session.run(None, feeds)
        for index, pool in enumerate(pools):
            pool.reshape(spec.num_kv_heads, -1, row)[:, step.slot_mapping] = new_kv[index].swapaxes(0, 1)
        with torch.no_grad():
            ids_now = torch.tensor([tokens])
            spans = {"token_type_ids": (ids_now == image_id).long()} if vision.whole_images else {}  # Gemma 3's image mask
            ref = model(input_ids=ids_now, **inputs, **spans).logits[0, -1].numpy()
        worst = max(worst, float(np.abs(logits[-1] - ref).max()))
        done = len(tokens)
        tokens.append(int(ref.argmax()))
    return worst


__all__ = ["IMAGE_EMBEDS", "IMAGE_ROWS", "add_image_inputs", "export_vision_language"]
