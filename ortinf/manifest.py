"""The package manifest (`ortinf.json`): what the runtime knows about an exported model.

Torch-free on purpose: the exporter writes it, the runtime reads it, and the runtime never guesses
anything from the graph itself.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortinf.errors import ConfigError

MANIFEST_NAME = "ortinf.json"
MODEL_NAME = "model.onnx"
# Decoders: the same graph without the in-graph KV write (it outputs new_key.{i}/new_value.{i}), for
# host-memory providers where writing K/V with numpy is faster (OpenVINO: docs/providers.md). Both
# graphs read their weights from model.onnx.data.
HOST_WRITE_MODEL_NAME = "model.host-write.onnx"
WEIGHTS_NAME = MODEL_NAME + ".data"
# Decoders: the graph for ONNX Runtime's CPU provider with ortinf's compiled kernel library (one
# ortinf.PagedAttention op per layer: ortinf/exporter/attention_cpu.py), sharing model.onnx.data. Optional: the
# runtime falls back to model.onnx where it is missing or the library does not load.
CPU_MODEL_NAME = "model.cpu.onnx"
FORMAT_VERSION = 3  # 3: the graph writes K/V into its pool (key_cache_out.{i}); see ortinf/exporter/kv_write.py

TEXT_GENERATION = "text-generation"
FEATURE_EXTRACTION = "feature-extraction"
TEXT_CLASSIFICATION = "text-classification"
SPEECH_RECOGNITION = "automatic-speech-recognition"
TEXT2TEXT = "text2text-generation"  # text encoder-decoders: Marian translation, BART (ortinf/exporter/seq2seq.py)
IMAGE_TEXT_TO_TEXT = "image-text-to-text"  # the export task of vision-language models; their packages are text-generation ones with `vision`
TASKS = (TEXT_GENERATION, FEATURE_EXTRACTION, TEXT_CLASSIFICATION, SPEECH_RECOGNITION, TEXT2TEXT, IMAGE_TEXT_TO_TEXT)
ENCODER_MODEL_NAME = "encoder.onnx"  # an encoder-decoder's encoder graph (Whisper: audio -> cross-attention K/V)
ENCODER_WRITE_MODEL_NAME = "encoder.pool-write.onnx"  # the encoder writing its cross K/V into a device pool in place
ALIGNMENT_MODEL_NAME = "alignment.onnx"  # Whisper's word timing: the alignment heads' cross-attention of a window
VISION_MODEL_NAME = "vision.onnx"
VISION_CPU_MODEL_NAME = "vision.cpu.onnx"  # a vision-language model's vision tower and projector (pixels -> image embeddings)
MEL_FILTERS_NAME = "mel_filters.npy"  # Whisper's mel filter bank [1 + n_fft // 2, num_mel_bins]
# The attention kernels a decoder graph can be exported with (kernels/), and the per-layer KV pool
# layout (key_cache.{i} / value_cache.{i}) each one reads.
PORTABLE = "portable"
CONTRIB_PAGED = "paged-attention"
KERNELS = (PORTABLE, CONTRIB_PAGED)
KV_LAYOUT = "kv_heads,num_blocks,block_size,head_dim"
BLOCKS_FIRST_LAYOUT = "num_blocks,block_size,kv_heads,head_dim"
KV_LAYOUTS = {PORTABLE: KV_LAYOUT, CONTRIB_PAGED: BLOCKS_FIRST_LAYOUT}


def min_block_size(kernel: str) -> int:
    """The smallest block size a kernel runs with (PagedAttention: a power of two >= 16)."""
    return 16 if kernel == CONTRIB_PAGED else 1


def check_block_size(kernel: str, block_size: int) -> None:
    if kernel == CONTRIB_PAGED and (block_size < 16 or block_size & (block_size - 1)):
        raise ConfigError(f"the {kernel} kernel needs a block size that is a power of two, at least 16 (got {block_size})")
# Decoder graph I/O names the runtime reads by name (never by position).
LOGITS = "logits"
SLOT_MAPPING = "slot_mapping"


def new_kv_names(num_layers: int) -> list[str]:
    """The host-write graph's per-layer new K/V outputs, [num_tokens, kv_heads, head_dim] each."""
    return [f"new_{kind}.{i}" for i in range(num_layers) for kind in ("key", "value")]


def cache_names(num_layers: int) -> tuple[list[str], list[str]]:
    """The per-layer pool inputs (key_cache.{i}, value_cache.{i}) and the outputs the graph writes
    them back to (key_cache_out.{i}, ...), which the runtime binds to the same buffers."""
    inputs = [f"{kind}_cache.{i}" for i in range(num_layers) for kind in ("key", "value")]
    return inputs, [f"{name.replace('_cache.', '_cache_out.')}" for name in inputs]


@dataclass(frozen=True, slots=True)
class DecoderSpec:
    """Shape facts of a decoder graph with paged-KV I/O (see docs/architecture.md, "The exported graph")."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_model_len: int
    kernel: str
    kv_dtype: str
    sliding_window: int | None = None
    kv_layout: str = KV_LAYOUT
    # `--enable-lora`: {target linear: [in_features, out_features]}, each with LoRA inputs (ortinf/exporter/lora.py)
    lora_targets: dict[str, list[int]] = field(default_factory=dict)
    # Qwen2-VL's multimodal RoPE: the rotary dimensions' split over (temporal, height, width) positions; the graph
    # then takes `rope_deltas` [3, num_tokens], added to `positions` per section (ortinf/runtime/worker/mrope.py)
    mrope_section: tuple[int, ...] | None = None
    # Gemma 3's images: a prefill's image tokens attend to each other both ways; the graph then takes `attend_until`
    # [num_tokens], the last position each token may see (its own outside an image; the portable kernel only)
    image_spans: bool = False


MROPE_DELTAS = "rope_deltas"
ATTEND_UNTIL = "attend_until"
KV_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "int8": 1}


def pool_row(spec: DecoderSpec) -> int:
    """The last dimension of a pool tensor: head_dim, or head_dim + 4 for int8 rows (the values, then their
    float scale's 4 bytes: ortinf/kernels/cpu/attention_impl.h)."""
    return spec.head_dim + 4 if spec.kv_dtype == "int8" else spec.head_dim


LORA_MASK = "lora_mask"  # [num_tokens, lora_width]: each token's adapter scale on its adapter's columns


def lora_a_name(layer: int, target: str) -> str:
    return f"lora_a.{layer}.{target}"  # [in_features, lora_width]


def lora_b_name(layer: int, target: str) -> str:
    return f"lora_b.{layer}.{target}"  # [lora_width, out_features]


def lora_input_names(num_layers: int, targets) -> list[str]:  # any iterable of target names
    """The mask, then per layer, per target, A and B (one input each: bound once, never gathered)."""
    return [LORA_MASK, *(n for layer in range(num_layers) for t in targets for n in (lora_a_name(layer, t), lora_b_name(layer, t)))]


@dataclass(frozen=True, slots=True)
class SpeechSpec:
    """An encoder-decoder speech model's encoder side (Whisper; ortinf/exporter/whisper.py). The decoder side is
    the package's DecoderSpec; its graph also takes cross_block_tables [S, blocks] and cross_lens [S]:
    each sequence's cross-attention K/V sit in pool blocks of its own."""

    num_mel_bins: int
    source_positions: int  # cross-attention keys per request (1500 for 30 s)
    window_samples: int  # 16 kHz samples per encoder window (480000: 30 s)
    decoder_start_token_id: int
    encoder_graph: str = ENCODER_MODEL_NAME
    mel_filters: str = MEL_FILTERS_NAME
    alignment_graph: str | None = None  # word timing; None in packages written before it
    encoder_write_graph: str | None = None  # device pools (WebGPU, CUDA); None in packages written before it
    alignment_heads: tuple[tuple[int, int], ...] = ()  # (decoder layer, head) whose cross-attention follows the audio
    median_filter_width: int = 7


@dataclass(frozen=True, slots=True)
class Seq2SeqSpec:
    """A text encoder-decoder's encoder side (ortinf/exporter/seq2seq.py): encoder.onnx takes input_ids and
    attention_mask [B, S]; the decoder is the package's DecoderSpec with cross_block_tables/cross_lens."""

    max_source_positions: int
    decoder_start_token_id: int
    encoder_graph: str = ENCODER_MODEL_NAME


@dataclass(frozen=True, slots=True)
class EncoderSpec:
    """Facts of an encoder graph: its inputs, pooling and labels."""

    hidden_size: int
    max_model_len: int
    input_names: tuple[str, ...]
    pooling: str | None = None
    normalize: bool = False
    embedding_dim: int | None = None
    labels: tuple[str, ...] = ()
    vocab_size: int | None = None  # None in packages written before it was recorded


@dataclass(frozen=True, slots=True)
class Quantization:
    """Weight-only quantization of the decoder's MatMuls (ortinf/exporter/quantize.py)."""

    bits: int
    block_size: int
    accuracy_level: int
    method: str = ("symmetric, blockwise (MatMulNBits in model.onnx, ortinf.QMatMul in model.cpu.onnx); LM head included, "
                   "MoE routers and embeddings not (the KV cache's dtype is its own line)")


@dataclass(frozen=True, slots=True)
class Quality:
    """Reduced-precision verification against the fp32 PyTorch model (ortinf/exporter/verify.py)."""

    top1_agreement: float  # share of positions whose next-token argmax equals the reference's
    mean_kl: float  # mean KL(reference || package) of next-token distributions, nats
    greedy_agreement: float  # mean share of 32 greedy tokens equal to the reference's, up to the first difference
    min_top1_agreement: float
    max_mean_kl: float
    min_greedy_agreement: float
    description: str
    enforced: bool = True  # False: exported with --quality-gate record, the figures kept whatever they were

    def failures(self) -> list[str]:
        """The thresholds these figures miss, in words."""
        out = []
        if self.top1_agreement < self.min_top1_agreement:
            out.append(f"top-1 agreement {self.top1_agreement:.3f} < {self.min_top1_agreement}")
        if self.mean_kl > self.max_mean_kl:
            out.append(f"mean KL {self.mean_kl:.4f} > {self.max_mean_kl}")
        if self.greedy_agreement < self.min_greedy_agreement:
            out.append(f"greedy agreement {self.greedy_agreement:.3f} < {self.min_greedy_agreement}")
        return out


@dataclass(frozen=True, slots=True)
class CpuKernel:
    """The package's graph for the CPU provider with ortinf's kernel library, and its parity."""

    graph: str  # CPU_MODEL_NAME
    domain: str  # the custom-op domain the graph uses ("ortinf")
    ops: tuple[str, ...]  # the library's ops it uses
    max_abs_diff: float  # against PyTorch, measured at export as Parity is for model.onnx
    description: str
    # the pool this graph reads, when not the decoder's kv_dtype: "int8" (`--kv-dtype int8`: rows of int8
    # values and their scale, which only ortinf.PagedAttention reads; the portable graph keeps the decoder's)
    kv_dtype: str = ""


@dataclass(frozen=True, slots=True)
class VisionSpec:
    """A vision-language package's image side (ortinf/exporter/vision_language.py): vision.onnx turns an image's
    pixels into `tokens_per_image` embeddings that replace the prompt's `image_token_id` placeholders."""

    image_token_id: int
    tokens_per_image: int  # 0: each image's own (Qwen2-VL: its patch grid / merge_size**2)
    image_size: int  # LLaVA's tower size (0 where images keep their own size)
    processor: dict[str, Any] = field(default_factory=dict)  # how the family's image processor prepares pixels
    max_abs_diff: float = float("nan")  # logits with an image, against transformers, at export
    family: str = "llava"  # the runtime's record that serves its images (ortinf/runtime/worker/vision_families/)
    merge_size: int = 1  # patches merged into one token per side (Qwen2-VL: 2)
    image_start_id: int | None = None  # tokens around an image's placeholder in chat prompts (Qwen2-VL's vision start / end)
    image_end_id: int | None = None
    placeholder_id: int | None = None  # the token a prompt marks an image with, when not image_token_id (Gemma 3's <start_of_image>)
    image_prefix_ids: tuple[int, ...] = ()  # what a placeholder expands to around the image's tokens (Gemma 3: "\n\n<start_of_image>"
    image_suffix_ids: tuple[int, ...] = ()  # ... and "<end_of_image>\n\n")
    whole_images: bool = False  # a prefill chunk may not end inside an image (Gemma 3's bidirectional image attention)
    dtype: str = "fp32"  # the vision graph's MatMul weights (--vision-dtype)
    embedding_cosine: float = float("nan")  # int8/int4: the least cosine similarity of its embeddings to fp32's, at export
    cpu_graph: str = ""  # int8/int4: the tower's graph for ortinf's CPU kernel library (QMatMul), when written


@dataclass(frozen=True, slots=True)
class Parity:
    """What export-time verification measured: ORT vs the PyTorch model on a fixed prompt."""

    max_abs_diff: float
    tolerance: float
    description: str


@dataclass(frozen=True, slots=True)
class Manifest:
    """Everything the runtime reads about a package."""

    task: str
    architecture: str
    model_type: str
    dtype: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    decoder: DecoderSpec | None = None
    encoder: EncoderSpec | None = None
    speech: SpeechSpec | None = None
    seq2seq: Seq2SeqSpec | None = None
    parity: Parity | None = None
    quantization: Quantization | None = None
    quality: Quality | None = None
    cpu_kernel: CpuKernel | None = None
    vision: VisionSpec | None = None  # a vision-language model's: its decoder also takes image embeddings
    has_tokenizer: bool = False
    has_chat_template: bool = False
    source: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        if data["vision"] is None:  # written only where there is one: a text package stays readable by older ortinf
            del data["vision"]
        for key, default in (("mrope_section", None), ("image_spans", False)):  # written where set (older readers)
            if data["decoder"] is not None and data["decoder"][key] == default:
                del data["decoder"][key]
        return json.dumps(data, indent=2, sort_keys=False) + "\n"

    def save(self, folder: Path) -> None:
        (folder / MANIFEST_NAME).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        data = dict(data)
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ConfigError(
                f"manifest format_version {version!r} is not {FORMAT_VERSION}: re-export the package "
                "with this version of ortinf"
            )
        for key, kind in (("decoder", DecoderSpec), ("encoder", EncoderSpec), ("speech", SpeechSpec), ("seq2seq", Seq2SeqSpec), ("parity", Parity),
                          ("quantization", Quantization), ("quality", Quality), ("cpu_kernel", CpuKernel), ("vision", VisionSpec)):
            if data.get(key) is not None:
                data[key] = _build(kind, data[key])
        return _build(cls, data)

    @classmethod
    def load(cls, folder: str | Path) -> Manifest:
        """Reads `folder/ortinf.json`; every failure is a ConfigError that says what to do."""
        path = Path(folder) / MANIFEST_NAME
        if is_gguf(folder):
            raise ConfigError(GGUF_MESSAGE.format(path=folder))
        if not Path(folder).exists():
            raise ConfigError(f"no such folder: {folder}: pass the folder written by `ortinf export`")
        if not Path(folder).is_dir():
            raise ConfigError(f"{folder} is not a folder: pass the folder written by `ortinf export`")
        if not path.is_file():
            raise ConfigError(f"{folder} has no {MANIFEST_NAME}: it is not an ortinf package (make one with `ortinf export`)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path} is unreadable ({exc}): re-export the package") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path} does not hold a JSON object: re-export the package")
        return cls.from_dict(data)


GGUF_MESSAGE = ("{path} is a GGUF file (llama.cpp's format): export it into a package first, `ortinf export {path} -o PKG` "
                "(or export the Hugging Face folder it came from), then pass PKG")


def is_gguf(path: str | Path) -> bool:
    """Whether `path` is a GGUF file (by its magic bytes, or its name when unreadable)."""
    path = Path(path)
    if not path.is_file():
        return False
    try:
        with path.open("rb") as file:
            return file.read(4) == b"GGUF" or path.suffix.lower() == ".gguf"
    except OSError:
        return path.suffix.lower() == ".gguf"


def _build(kind: type, data: dict[str, Any]) -> Any:
    """Builds a manifest dataclass from JSON, turning lists back into tuples."""
    names = {f.name for f in dataclasses.fields(kind)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"manifest has unknown fields {sorted(unknown)}: re-export the package with this ortinf")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    try:
        return kind(**values)
    except TypeError as exc:
        raise ConfigError(f"manifest is incomplete ({exc}): re-export the package") from exc
