"""Vision-language models (issue 33): LLaVA first. A package is the language model's ordinary decoder
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
transformers' LLaVA on a prompt with an image.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from ortinf.errors import ExportError
from ortinf.exporter import idefics3, qwen_vl
from ortinf.exporter.config import ExportConfig
from ortinf.exporter.decoder import IMAGE_SPANS_ATTRIBUTE
from ortinf.exporter.tracing import OPSET, quiet_tracing
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
VISION_LANGUAGE = {"llava": "LlavaForConditionalGeneration", "llava_next": "LlavaNextForConditionalGeneration",
                   "gemma3": "Gemma3ForConditionalGeneration", **qwen_vl.FAMILIES,
                   **idefics3.FAMILIES}
IMAGE_EMBEDS, IMAGE_ROWS = "image_embeds", "image_rows"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json", "tokenizer.model", "added_tokens.json")


class VisionGraph(torch.nn.Module):
    """pixel_values -> each image's embeddings in the language model's space."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        config, inner = self.model.config, self.model.model
        if config.model_type == "gemma3":  # SigLIP, 4x4 average pooling, RMS norm, projection: already one tensor
            return inner.get_image_features(pixel_values)
        # transformers' get_image_features, without its split into a list (a traced Split keeps the example's count)
        states = inner.vision_tower(pixel_values, output_hidden_states=True).hidden_states
        layers = config.vision_feature_layer if isinstance(config.vision_feature_layer, list) else [config.vision_feature_layer]
        features = torch.cat([states[i] for i in layers], dim=-1)
        if config.vision_feature_select_strategy == "default":
            features = features[:, 1:]
        if config.model_type == "llava_next":  # and the newline embedding, which the host writes after each row of tiles
            return inner.multi_modal_projector(features), inner.image_newline
        return inner.multi_modal_projector(features)


def text_folder(model: torch.nn.Module, source: Path, folder: Path) -> Path:
    """The language model alone as a Hugging Face folder (and the source's tokenizer files)."""
    import transformers

    config = qwen_vl.text_config(model) if model.config.model_type in qwen_vl.FAMILIES else copy.deepcopy(model.config.text_config)
    if model.config.model_type == "gemma3":  # its prefill's image tokens see their whole image (token_type_ids' mask)
        setattr(config, IMAGE_SPANS_ATTRIBUTE, True)
    text = transformers.AutoModelForCausalLM.from_config(config)
    language = model.model.text_model if model.config.model_type in idefics3.FAMILIES else model.model.language_model
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


def image_processor(source: Path, model: torch.nn.Module) -> dict:
    """The source's CLIP image processor settings (preprocessor_config.json), or CLIP's defaults at the tower's size."""
    path = source / "preprocessor_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    size = model.config.vision_config.image_size
    shortest = (config.get("size") or {}).get("shortest_edge", size)
    crop = config.get("crop_size") or {"height": size, "width": size}
    return {"resize_shortest_edge": int(shortest), "crop_height": int(crop["height"]), "crop_width": int(crop["width"]),
            "do_center_crop": bool(config.get("do_center_crop", True)), "rescale_factor": float(config.get("rescale_factor", 1 / 255)),
            "image_mean": list(config.get("image_mean", [0.48145466, 0.4578275, 0.40821073])),
            "image_std": list(config.get("image_std", [0.26862954, 0.26130258, 0.27577711])),
            "resample": int(config.get("resample", 3)), "do_convert_rgb": bool(config.get("do_convert_rgb", True))}


def export_vision_language(source, out_path: Path, export_text, options: ExportConfig) -> Manifest:  # noqa: ANN001
    """A LLaVA package: the language model through the text decoder export (`export_text`: ortinf.exporter.api.export,
    with the same `options`), then the image inputs, vision.onnx and their verification."""
    overwrite, tolerance, vision_dtype = options.overwrite, options.tolerance, options.vision_dtype
    import transformers

    from ortinf.exporter.package import staging

    try:
        model = getattr(transformers, VISION_LANGUAGE[source.model_type]).from_pretrained(source.path, dtype=torch.float32).eval()
    except Exception as exc:  # noqa: BLE001 - user-facing
        raise ExportError(f"cannot load {source.name}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}") from exc
    config = model.config
    hidden = config.text_config.hidden_size
    if config.model_type == "gemma3" and options.kernel != PORTABLE:  # bidirectional image attention
        raise ExportError("Gemma 3's image tokens attend both ways, which the portable kernel and ortinf's CPU kernel draw: "
                          "drop --kernel")
    with tempfile.TemporaryDirectory(prefix="ortinf-vlm-") as tmp, qwen_vl.quiet_mrope_keys():
        text = text_folder(model, Path(source.path), Path(tmp) / "text")
        manifest = export_text(text, Path(tmp) / "pkg", dataclasses.replace(options, task="text-generation", overwrite=True,
                                                                            vision_dtype="fp32"))
        package = Path(tmp) / "pkg"
        graphs = [name for name in (MODEL_NAME, HOST_WRITE_MODEL_NAME, CPU_MODEL_NAME) if (package / name).is_file()]
        for name in graphs:
            add_image_inputs(package / name, hidden)
        vision = export_vision_graph(model, Path(source.path), package / VISION_MODEL_NAME)
        if vision_dtype != "fp32":
            vision = quantize_vision(package / VISION_MODEL_NAME, vision, vision_dtype, model, options)
        worst = check_image_path(model, package, vision)
        exact = manifest.dtype == "fp32" and vision_dtype == "fp32"
        limit = tolerance if tolerance is not None and exact else (1e-3 if exact else float("inf"))
        if not worst <= limit:
            raise ExportError(f"verification failed: with an image, the package's logits differ from transformers' "
                              f"{VISION_LANGUAGE[source.model_type]} by {worst:.3g}, "
                              f"above {limit:g}; nothing was written")
        manifest = dataclasses.replace(manifest, architecture=VISION_LANGUAGE[source.model_type], model_type=source.model_type,
                                       inputs=(*manifest.inputs, IMAGE_EMBEDS, IMAGE_ROWS), vision=dataclasses.replace(vision, max_abs_diff=worst),
                                       source=str(source.name))
        manifest.save(package)
        with staging(out_path, overwrite) as stage:
            for item in package.iterdir():
                shutil.move(str(item), stage / item.name)
    return manifest


def export_vision_graph(model: torch.nn.Module, source: Path, path: Path) -> VisionSpec:
    """Traces the family's vision graph to `path`; returns what the runtime needs to feed it."""
    config = model.config
    with torch.no_grad(), quiet_tracing():
        if config.model_type in qwen_vl.FAMILIES:
            axes = {name: {0: "num_patches"} for name in qwen_vl.VISION_INPUTS}
            axes.update({name: {0: "num_windows", 1: "window_length"} for name in ("window_index", "window_mask")})
            torch.onnx.export(qwen_vl.QwenVisionGraph(model.model.visual).eval(), qwen_vl.example_inputs(config.vision_config), str(path),
                              dynamo=False, input_names=list(qwen_vl.VISION_INPUTS), output_names=[IMAGE_EMBEDS], opset_version=OPSET,
                              dynamic_axes={**axes, IMAGE_EMBEDS: {0: "num_image_tokens"}})
            return VisionSpec(image_token_id=int(config.image_token_id), tokens_per_image=0, image_size=0,
                              processor=qwen_vl.processor_settings(source, model), family="qwen2_vl",
                              merge_size=int(config.vision_config.spatial_merge_size), image_start_id=int(config.vision_start_token_id),
                              image_end_id=int(config.vision_end_token_id))
        size = config.vision_config.image_size
        if config.model_type in idefics3.FAMILIES:
            torch.onnx.export(idefics3.TileGraph(model).eval(), (torch.randn(2, 3, size, size),), str(path), dynamo=False,
                              input_names=["pixel_values"], output_names=[IMAGE_EMBEDS], opset_version=OPSET,
                              dynamic_axes={"pixel_values": {0: "num_tiles"}, IMAGE_EMBEDS: {0: "num_tiles"}})
            per_tile = idefics3.tokens_per_tile(model)
            return VisionSpec(image_token_id=int(config.image_token_id), tokens_per_image=per_tile, image_size=int(size),
                              processor=idefics3.processor_settings(source, model, per_tile), family="idefics3")
        outputs = [IMAGE_EMBEDS, "image_newline"] if config.model_type == "llava_next" else [IMAGE_EMBEDS]
        torch.onnx.export(VisionGraph(model).eval(), (torch.randn(2, 3, size, size),), str(path), dynamo=False,
                          input_names=["pixel_values"], output_names=outputs, opset_version=OPSET,
                          dynamic_axes={"pixel_values": {0: "num_images"}, IMAGE_EMBEDS: {0: "num_images"}})
    if config.model_type == "gemma3":
        around = newlines(source)  # the processor writes "\n\n<start_of_image>" + image tokens + "<end_of_image>\n\n"
        return VisionSpec(image_token_id=int(config.image_token_index), tokens_per_image=int(config.mm_tokens_per_image),
                          image_size=int(size), processor=gemma_processor(source, model), placeholder_id=int(config.boi_token_index),
                          image_prefix_ids=(*around, int(config.boi_token_index)), image_suffix_ids=(int(config.eoi_token_index), *around),
                          whole_images=True)
    if config.model_type == "llava_next":  # a tile's tokens; an image's own count follows its size (anyres_tiles)
        processor = image_processor(source, model)
        side = size // config.vision_config.patch_size
        pinpoints = [list(p) for p in config.image_grid_pinpoints]
        return VisionSpec(image_token_id=int(config.image_token_index), tokens_per_image=side * side, image_size=int(size),
                          processor={**processor, "grid_pinpoints": pinpoints, "tokens_per_side": side}, family="llava_next")
    return VisionSpec(image_token_id=int(config.image_token_index), tokens_per_image=int(config.image_seq_length),
                      image_size=int(size), processor=image_processor(source, model))


def newlines(source: Path) -> tuple[int, ...]:
    """The ids of "\n\n" in the source's tokenizer (none without one)."""
    if not (source / "tokenizer.json").is_file():
        return ()
    from tokenizers import Tokenizer

    return tuple(Tokenizer.from_file(str(source / "tokenizer.json")).encode("\n\n", add_special_tokens=False).ids)


def gemma_processor(source: Path, model: torch.nn.Module) -> dict:
    """Gemma3ImageProcessor's settings: a plain resize to the tower's size (bilinear), rescale, normalise by 0.5."""
    path = source / "preprocessor_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    size = config.get("size") or {}
    side = model.config.vision_config.image_size
    return {"resize_height": int(size.get("height", side)), "resize_width": int(size.get("width", side)), "do_center_crop": False,
            "rescale_factor": float(config.get("rescale_factor", 1 / 255)), "image_mean": list(config.get("image_mean", [0.5] * 3)),
            "image_std": list(config.get("image_std", [0.5] * 3)), "resample": int(config.get("resample", 2)),
            "do_convert_rgb": bool(config.get("do_convert_rgb", True))}


# Least cosine similarity of a quantized tower's image embeddings to fp32's, per embedding row, over random inputs. Measured
# on the tests' tiny random towers (2-3 layers, 32 wide; block sizes 128 / 32): int8 0.99984-0.99995 (LLaVA, Qwen2.5-VL,
# Gemma 3, Idefics3), int4 0.983-0.994; a broken quantization gives ~0.
VISION_COSINE = {"int8": 0.99, "int4": 0.9}


def quantize_vision(path: Path, vision: VisionSpec, dtype: str, model: torch.nn.Module, config: ExportConfig) -> VisionSpec:
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
            feeds = random_vision_feeds(model, vision, rng)
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


def random_vision_feeds(model: torch.nn.Module, vision: VisionSpec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The vision graph's inputs for two random images (Qwen2-VL: of 4x6 and 6x4 patches)."""
    from ortinf.runtime.worker.vision_encoder import qwen_vision_feeds

    if vision.family == "qwen2_vl":
        config, merge = model.config.vision_config, vision.merge_size
        width = config.in_channels * config.temporal_patch_size * config.patch_size ** 2
        grids = [(2, 3), (3, 2)]
        images = [(rng.standard_normal((r * c * merge * merge, width)).astype(np.float32), (r, c)) for r, c in grids]
        return qwen_vision_feeds(images, merge, int(vision.processor.get("window_units", 0)))[0]
    return {"pixel_values": rng.standard_normal((2, 3, vision.image_size, vision.image_size)).astype(np.float32)}


def check_image_path(model: torch.nn.Module, package: Path, vision: VisionSpec) -> float:
    """The package's logits (host-write graph, one prefill of a prompt holding an image, then one decode step)
    against transformers' model on the same ids and pixels: the max abs difference. The image's embeddings come from
    the runtime's own VisionEncoder (its batching, window order, tile packing and placement), so the check covers them."""
    import onnxruntime

    from ortinf.providers.registry import resolve
    from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage
    from ortinf.runtime.worker.image_spans import attend_until
    from ortinf.runtime.worker.images import anyres_layout, prompt_tokens
    from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input
    from ortinf.runtime.worker.mrope import rope_deltas
    from ortinf.runtime.worker.vision_encoder import VisionEncoder

    manifest = dataclasses.replace(Manifest.load(package), vision=vision)
    spec = manifest.decoder
    rng = np.random.default_rng(5)
    encoder = VisionEncoder(package, manifest, resolve("cpu"), 0, np.dtype(np.float32))
    image_id, size = vision.image_token_id, vision.image_size
    if vision.family == "idefics3":  # an image of one tile: <fake><global-img> its tokens <fake>
        pixels = rng.standard_normal((1, 3, size, size)).astype(np.float32)
        inputs = {"pixel_values": torch.from_numpy(pixels[None])}
        tokens, rows = prompt_tokens(0, 0, image_id, vision.processor["expansion"])
        ids = [5, 7, *tokens, 9, 11]
        placed = PlacedImage(2 + rows[0], EncoderInput.of(pixels, len(rows), "image"), rows=tuple(r - rows[0] for r in rows),
                             span=len(tokens) - rows[0])
    elif vision.family == "llava_next":  # an image twice as high as wide: its whole and its tiles, packed with newlines
        rows, cols, keep_rows, keep_cols = anyres_layout(2 * size, size, vision.processor)
        pixels = rng.standard_normal((1 + rows * cols, 3, size, size)).astype(np.float32)
        inputs = {"pixel_values": torch.from_numpy(pixels[None]), "image_sizes": torch.tensor([[2 * size, size]])}
        count = vision.tokens_per_image + (keep_rows.stop - keep_rows.start) * (keep_cols.stop - keep_cols.start + 1)
        ids = [5, 7] + [image_id] * count + [9, 11, 13]
        placed = PlacedImage(2, EncoderInput.of(pixels, count, "image"), (2 * size, size))
    elif vision.family == "llava":  # LLaVA, and Gemma 3 with its text around the image and its span
        pixels = rng.standard_normal((1, 3, size, size)).astype(np.float32)
        inputs = {"pixel_values": torch.from_numpy(pixels)}
        ids = [5, 7, *vision.image_prefix_ids] + [image_id] * vision.tokens_per_image + [*vision.image_suffix_ids, 9, 11, 13]
        placed = PlacedImage(ids.index(image_id), EncoderInput.of(pixels[0], vision.tokens_per_image, "image"), whole=vision.whole_images)
    else:  # a 2 x 3-token image (rows x columns of merged patches) between Qwen2-VL's vision start and end tokens
        merge, config = vision.merge_size, model.config
        grid = (2, 3)
        width = config.vision_config.in_channels * config.vision_config.temporal_patch_size * config.vision_config.patch_size ** 2
        patches = rng.standard_normal((grid[0] * grid[1] * merge * merge, width)).astype(np.float32)
        inputs = {"pixel_values": torch.from_numpy(patches), "image_grid_thw": torch.tensor([[1, grid[0] * merge, grid[1] * merge]])}
        ids = [5, config.vision_start_token_id] + [image_id] * (grid[0] * grid[1]) + [config.vision_end_token_id, 9, 11]
        placed = PlacedImage(2, EncoderInput.of(patches, grid[0] * grid[1], "image"), grid)
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


__all__ = ["IMAGE_EMBEDS", "IMAGE_ROWS", "VISION_LANGUAGE", "add_image_inputs", "export_vision_language"]
