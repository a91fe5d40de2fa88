"""What the exporter supports, per task, and each architecture's quirks.

Decoders hook in through transformers' attention interface (ortinf/exporter/attention_portable.py), so a new
architecture needs an entry here and a parity test, not a new graph. Quirks that live outside the
attention function (final-logit soft-capping, non-standard attention scaling) are recorded here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ortinf.errors import UnsupportedArchitectureError
from ortinf.exporter.vision import FAMILIES as VISION_FAMILIES
from ortinf.manifest import FEATURE_EXTRACTION, IMAGE_TEXT_TO_TEXT, SPEECH_RECOGNITION, TEXT2TEXT, TEXT_CLASSIFICATION, TEXT_GENERATION


def _inverse_sqrt(module: torch.nn.Module, head_dim: int) -> float:
    return head_dim**-0.5


def _gpt2_scaling(module: torch.nn.Module, head_dim: int) -> float:
    # GPT-2 passes no `scaling` to the attention function; its eager path divides by sqrt(d) when
    # scale_attn_weights is set, and by (layer_idx + 1) when scale_attn_by_inverse_layer_idx is.
    scale = head_dim**-0.5 if module.scale_attn_weights else 1.0
    if module.scale_attn_by_inverse_layer_idx:
        scale /= float(module.layer_idx + 1)
    return scale


@dataclass(frozen=True, slots=True)
class DecoderArch:
    """One supported decoder architecture."""

    model_type: str
    example: str
    default_scaling: Callable[[torch.nn.Module, int], float] = _inverse_sqrt
    # RoPE is transformers' rotate_half form through the modeling module's apply_rotary_pos_emb(q, k,
    # cos, sin, ...) on the first cos.shape[-1] dims, so the CPU kernel graph may apply it inside
    # ortinf.PagedAttention (ortinf/exporter/attention_cpu.py). False for learned positions or another RoPE form.
    rope_in_kernel: bool = True
    # the modeling's cos/sin hold each frequency once ([T, D/2], gpt-oss's first/second-half rotation),
    # where rotate_half's tables repeat them ([T, D]): the CPU op gets them repeated
    rope_half_tables: bool = False


DECODERS: dict[str, DecoderArch] = {
    arch.model_type: arch
    for arch in (
        DecoderArch("llama", "Llama 2/3, TinyLlama, SmolLM"),
        DecoderArch("mistral", "Mistral 7B (sliding window)"),
        DecoderArch("qwen2", "Qwen2, Qwen2.5"),
        DecoderArch("qwen3", "Qwen3 (qk-norm)"),
        DecoderArch("phi3", "Phi-3, Phi-3.5 mini (fused qkv)"),
        DecoderArch("gemma2", "Gemma 2 (soft-capping, alternating sliding window)"),
        DecoderArch("gemma3_text", "Gemma 3 1B and the text of 4B/12B/27B (5:1 local/global, qk-norm, two RoPE bases)"),
        DecoderArch("olmo2", "OLMo 2 (qk-norm on the projections, post-norm)"),
        DecoderArch("granite", "IBM Granite 3.x (embedding, residual, attention and logit multipliers)"),
        DecoderArch("smollm3", "SmolLM3 (RoPE skipped on every 4th layer)"),
        DecoderArch("gpt_neox", "GPT-NeoX, Pythia (partial rotary, parallel residual)"),
        DecoderArch("qwen3_moe", "Qwen3-30B-A3B, Qwen3-235B-A22B (mixture of experts, qk-norm)"),
        DecoderArch("qwen2_moe", "Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B (mixture of experts with a gated shared expert)"),
        DecoderArch("mixtral", "Mixtral 8x7B, 8x22B (mixture of experts)"),
        DecoderArch("olmoe", "OLMoE 1B-7B (mixture of experts, qk-norm, clip_qkv)"),
        DecoderArch("gpt_oss", "gpt-oss 20B/120B (mixture of experts, attention sinks, alternating sliding window)",
                    rope_half_tables=True),
        DecoderArch("gpt2", "GPT-2, DistilGPT2 (learned positions, Conv1D qkv)", _gpt2_scaling, rope_in_kernel=False),
    )
}

# Encoders are traced whole (no paged KV): these are the ones covered by parity tests.
ENCODERS: dict[str, str] = {
    "bert": "BERT, all-MiniLM-L6-v2, BGE",
    "roberta": "RoBERTa, all-distilroberta-v1",
    "xlm-roberta": "XLM-RoBERTa, multilingual-e5",
    "distilbert": "DistilBERT",
}

# Encoder-decoders for speech recognition: an encoder graph and a paged decoder graph (ortinf/exporter/whisper.py).
SPEECH: dict[str, str] = {
    "whisper": "Whisper tiny...large-v3, distil-whisper (encoder-decoder, docs/speech.md)",
}

# Text encoder-decoders on the same machinery: a token-id encoder graph and Whisper's paged decoder (ortinf/exporter/seq2seq.py).
SEQ2SEQ: dict[str, str] = {
    "marian": "Marian (Helsinki-NLP/opus-mt-*) translation",
    "bart": "BART (facebook/bart-*)",
    "t5": "T5, Flan-T5 (google/flan-t5-*; relative position bias in the paged kernel)",
    "mt5": "mT5 (google/mt5-*)",
}

# Vision-language models: the language model's decoder package plus vision.onnx (ortinf/exporter/vision_language.py);
# each family's record, with what it says of its model types, is its file in ortinf/exporter/vision/.
VISION_LANGUAGE: dict[str, str] = {model_type: example for family in VISION_FAMILIES for model_type, example in family.examples.items()}

# Decoders that also export as embedding models (`--task feature-extraction`: Qwen3-Embedding, gte-Qwen2, e5-mistral):
# the base model, its sentence-transformers pooling (last token) and normalisation in one encoder graph.
EMBEDDING_DECODERS = ("llama", "mistral", "qwen2", "qwen3")

SUPPORTED: dict[str, tuple[str, ...]] = {
    TEXT_GENERATION: tuple(DECODERS),
    FEATURE_EXTRACTION: (*ENCODERS, *EMBEDDING_DECODERS),
    TEXT_CLASSIFICATION: tuple(ENCODERS),
    SPEECH_RECOGNITION: tuple(SPEECH),
    TEXT2TEXT: tuple(SEQ2SEQ),
    IMAGE_TEXT_TO_TEXT: tuple(VISION_LANGUAGE),
}


def describe_supported() -> str:
    """A table of what is supported per task, for `ortinf export --list-architectures`."""
    lines = []
    for task, names in SUPPORTED.items():
        lines.append(f"{task}:")
        table = {TEXT_GENERATION: DECODERS, SPEECH_RECOGNITION: SPEECH, TEXT2TEXT: SEQ2SEQ, IMAGE_TEXT_TO_TEXT: VISION_LANGUAGE}.get(task, ENCODERS)
        for name in names:
            entry = table.get(name) or f"{DECODERS[name].example}, as an embedding model (its sentence-transformers pooling)"
            lines.append(f"  {name:<12} {entry.example if isinstance(entry, DecoderArch) else entry}")
    return "\n".join(lines)


def resolve_task(model_type: str, architectures: list[str] | None, requested: str) -> str:
    """Picks the task: the requested one, or from the config's architectures when 'auto'."""
    archs = architectures or []
    if requested == "auto" and not any(model_type in table for table in (DECODERS, ENCODERS, SPEECH, SEQ2SEQ, VISION_LANGUAGE)):
        raise UnsupportedArchitectureError(
            f"model_type '{model_type}' is not supported; supported: text-generation: {', '.join(DECODERS)}; "
            f"feature-extraction and text-classification: {', '.join(ENCODERS)}; automatic-speech-recognition: {', '.join(SPEECH)}; "
            f"text2text-generation: {', '.join(SEQ2SEQ)}; image-text-to-text: {', '.join(VISION_LANGUAGE)}"
        )
    if requested == "auto":
        if model_type in EMBEDDING_DECODERS and archs and all(a.endswith("Model") for a in archs):
            task = FEATURE_EXTRACTION  # a decoder saved without its LM head (Qwen3-Embedding: Qwen3Model): an embedding model
        elif model_type in DECODERS:
            task = TEXT_GENERATION
        elif model_type in SPEECH:
            task = SPEECH_RECOGNITION
        elif model_type in SEQ2SEQ:
            task = TEXT2TEXT
        elif model_type in VISION_LANGUAGE:
            task = IMAGE_TEXT_TO_TEXT
        elif any(a.endswith("ForSequenceClassification") for a in archs):
            task = TEXT_CLASSIFICATION
        else:
            task = FEATURE_EXTRACTION
    else:
        task = requested
    if model_type not in SUPPORTED[task]:
        raise UnsupportedArchitectureError(
            f"model_type '{model_type}' is not supported for {task}; supported: "
            f"{', '.join(SUPPORTED[task])} (see `ortinf export --list-architectures`)"
        )
    return task
