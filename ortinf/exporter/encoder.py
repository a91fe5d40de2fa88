"""Encoder export: BERT-style models for feature extraction (with sentence-transformers pooling and
normalisation inside the graph) and text classification (logits and labels)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from transformers import PreTrainedModel

from ortinf.errors import UnsupportedArchitectureError
from ortinf.exporter.architectures import EMBEDDING_DECODERS
from ortinf.exporter.source import ModelSource
from ortinf.exporter.tracing import OPSET, quiet_tracing
from ortinf.manifest import FEATURE_EXTRACTION, EncoderSpec

POOLING_MODES = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len")
_ST_POOLING_KEYS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}


def read_pooling(source: ModelSource) -> tuple[str, bool]:
    """(pooling mode, normalize) as the folder's sentence-transformers modules configure them.

    A plain transformers folder (no modules.json) gets mean pooling without normalisation.
    """
    modules_path = source.path / "modules.json"
    if not modules_path.is_file():
        return "mean", False
    modules = json.loads(modules_path.read_text(encoding="utf-8"))
    pooling, normalize = "mean", False
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind == "Pooling":
            config = json.loads((source.path / module["path"] / "config.json").read_text(encoding="utf-8"))
            modes = [mode for key, mode in _ST_POOLING_KEYS.items() if config.get(key)]
            named = config.get("pooling_mode")  # sentence-transformers 5 writes the mode's name
            if isinstance(named, str) and not modes:
                modes = [{"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max", "mean_sqrt_len_tokens": "mean_sqrt_len"}
                         .get(named, named)]
                if modes[0] not in POOLING_MODES:
                    raise UnsupportedArchitectureError(f"pooling '{named}' in {module['path']}: ortinf supports exactly one of "
                                                       f"{', '.join(POOLING_MODES)}")
            if len(modes) != 1:
                raise UnsupportedArchitectureError(
                    f"pooling {modes or 'none'} in {module['path']}: ortinf supports exactly one of {', '.join(POOLING_MODES)}"
                )
            pooling = modes[0]
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise UnsupportedArchitectureError(
                f"sentence-transformers module '{kind}' is not supported; supported: Transformer, Pooling, Normalize"
            )
    return pooling, normalize


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Pools token states [B, L, H] under attention mask [B, L] as sentence-transformers does."""
    weights = mask.to(hidden.dtype)[:, :, None]
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return torch.where(weights > 0, hidden, torch.full_like(hidden, -1e9)).max(dim=1).values
    if mode == "lasttoken":
        last = mask.to(torch.int64).sum(1) - 1
        return hidden[torch.arange(hidden.shape[0]), last]
    summed = (hidden * weights).sum(1)
    counts = weights.sum(1).clamp(min=1e-9)
    return summed / (counts.sqrt() if mode == "mean_sqrt_len" else counts)


class TracedEncoder(torch.nn.Module):
    """The traced module: token ids and mask in, embeddings or logits out."""

    def __init__(self, model: PreTrainedModel, task: str, pooling: str, normalize: bool, input_names: list[str]) -> None:
        super().__init__()
        self.model, self.task, self.pooling, self.normalize = model, task, pooling, normalize
        self.input_names = input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        kwargs = dict(zip(self.input_names, inputs))
        if getattr(self.model.config, "model_type", "") in EMBEDDING_DECODERS:  # a decoder as an embedding model
            dtype = next(self.model.parameters()).dtype
            out = self.model(input_ids=kwargs["input_ids"], attention_mask=causal_mask(kwargs["attention_mask"], dtype))
        else:
            out = self.model(**kwargs)
        if self.task != FEATURE_EXTRACTION:
            return out.logits
        embeddings = pool(out.last_hidden_state, kwargs["attention_mask"], self.pooling)
        if self.normalize:
            embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
        return embeddings


def causal_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A decoder's 4-D additive attention mask [B, 1, L, L] (causal, and no attending to padding). transformers
    takes a 4-D mask as it is; building its own (masking_utils' vmap) does not trace."""
    length = mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
    allowed = causal[None, None] & mask.bool()[:, None, None, :]
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def encoder_inputs(model: PreTrainedModel) -> list[str]:
    """The graph inputs: ids and mask, plus token_type_ids where the model takes them."""
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in inspect.signature(model.forward).parameters:
        names.append("token_type_ids")
    return names


def encoder_spec(model: PreTrainedModel, source: ModelSource, task: str, input_names: list[str]) -> EncoderSpec:
    config = model.config
    max_len = int(config.max_position_embeddings)
    if config.model_type in ("roberta", "xlm-roberta"):
        max_len -= config.pad_token_id + 1  # positions start after the padding index
    st_config = source.path / "sentence_bert_config.json"
    if st_config.is_file():  # sentence-transformers truncates at its own max_seq_length
        max_len = min(max_len, int(json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length") or max_len))
    window = getattr(config, "sliding_window", None)
    if config.model_type in EMBEDDING_DECODERS and window and getattr(config, "use_sliding_window", True):
        max_len = min(max_len, int(window))  # the graph's mask is fully causal: exact up to the window
    if task == FEATURE_EXTRACTION:
        pooling, normalize = read_pooling(source)
        return EncoderSpec(config.hidden_size, max_len, tuple(input_names), pooling, normalize, config.hidden_size,
                           vocab_size=config.vocab_size)
    labels = tuple(config.id2label[i] for i in range(config.num_labels))
    return EncoderSpec(config.hidden_size, max_len, tuple(input_names), labels=labels, vocab_size=config.vocab_size)


def example_batch(input_names: list[str], vocab_size: int, batch: int = 2, length: int = 7) -> tuple[torch.Tensor, ...]:
    """A padded batch: the second row is shorter, so masking is exercised."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab_size, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.int64)
    mask[1:, length - 3 :] = 0
    tensors = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    return tuple(tensors[name] for name in input_names)


def trace_encoder(graph: TracedEncoder, path: Path, vocab_size: int) -> tuple[list[str], list[str]]:
    """Traces the encoder to `path`; returns the graph's input and output names."""
    output = "embeddings" if graph.task == FEATURE_EXTRACTION else "logits"
    axes = {name: {0: "batch", 1: "sequence"} for name in graph.input_names}
    axes[output] = {0: "batch"}
    with torch.no_grad(), quiet_tracing():
        torch.onnx.export(
            graph.eval(),
            example_batch(graph.input_names, vocab_size),
            str(path),
            dynamo=False,
            input_names=graph.input_names,
            output_names=[output],
            dynamic_axes=axes,
            opset_version=OPSET,
        )
    return list(graph.input_names), [output]
