"""Decoder export: a wrapper whose inputs are the paged graph contract, traced to ONNX (the in-graph
KV write is added after tracing: ortinf/exporter/kv_write.py).

The wrapper runs the Hugging Face base model on the flattened tokens of all scheduled sequences
(as one batch row), with the paged attention function from kernels/ in every layer, and applies the
LM head only to the `logits_indices` rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel

from ortinf.errors import ExportError
from ortinf.exporter import attention_contrib as contrib_paged
from ortinf.exporter import attention_cpu as cpu_paged
from ortinf.exporter import attention_portable as portable
from ortinf.exporter.architectures import DECODERS
from ortinf.exporter.legacy_attention import has_legacy_attention, legacy_attention
from ortinf.exporter.lora import example_lora_inputs, find_targets, lora_dynamic_axes, lora_linears
from ortinf.exporter.moe import traceable_moe
from ortinf.exporter.tracing import OPSET, no_graph_shape_inference, quiet_tracing
from ortinf.manifest import (
    ATTEND_UNTIL,
    CONTRIB_PAGED,
    KV_LAYOUTS,
    LOGITS,
    MROPE_DELTAS,
    PORTABLE,
    DecoderSpec,
    cache_names,
    lora_input_names,
    new_kv_names,
    pool_row,
)

# The attention a graph is traced with: the package's kernel (the manifest's), or the CPU kernel
# library's op for the package's second graph, model.cpu.onnx (same inputs, pool and KV write).
CPU_PAGED = "cpu-paged"
# attention -> (transformers attention name, attention function)
ATTENTION = {
    PORTABLE: (portable.ATTENTION_NAME, portable.paged_attention),
    CONTRIB_PAGED: (contrib_paged.ATTENTION_NAME, contrib_paged.paged_attention),
    CPU_PAGED: (cpu_paged.ATTENTION_NAME, cpu_paged.paged_attention),
}

INPUTS_HEAD = ("input_ids", "positions", "block_tables", "context_lens", "query_lens", "logits_indices")


class PagedDecoder(torch.nn.Module):
    """The traced module: graph inputs in, `logits [num_seqs, vocab]` and new K/V per layer out."""

    def __init__(self, model: PreTrainedModel, kernel: str = PORTABLE, lora_targets: dict | None = None) -> None:
        super().__init__()
        self.model = model
        self.lora_targets = dict(lora_targets or {})
        self.kernel = kernel
        base = model.base_model
        self.base = model.model if base is model else base  # Gemma 3's prefix names the multimodal model's part
        self.lm_head = model.get_output_embeddings()
        self.final_softcap = getattr(model.config, "final_logit_softcapping", None)
        self.logits_scaling = getattr(model.config, "logits_scaling", None)  # Granite divides its logits
        self.num_layers = model.config.num_hidden_layers
        self.default_scaling = DECODERS[model.config.model_type].default_scaling
        self.num_heads, self.num_kv_heads, self.head_dim = head_shape(model.config)
        self.mrope_section = mrope_section(model.config)
        self.image_spans = bool(getattr(model.config, IMAGE_SPANS_ATTRIBUTE, False))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        query_lens: torch.Tensor,
        logits_indices: torch.Tensor,
        *rest: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        deltas = until = None
        if self.image_spans:  # the last input: attend_until [num_tokens]
            *rest, until = rest
        if self.mrope_section:  # then rope_deltas [3, num_tokens]
            *rest, deltas = rest
        caches, lora = rest[: 2 * self.num_layers], rest[2 * self.num_layers :]
        if self.kernel == CPU_PAGED:
            batch = cpu_paged.CpuBatch(
                block_tables=block_tables, context_lens=context_lens, query_lens=query_lens,
                key_caches=list(caches[0::2]), value_caches=list(caches[1::2]), num_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, default_scaling=self.default_scaling,
            )
        elif self.kernel == CONTRIB_PAGED:
            batch = contrib_paged.ContribBatch(
                block_tables=block_tables, context_lens=context_lens, query_lens=query_lens,
                key_caches=list(caches[0::2]), value_caches=list(caches[1::2]),
                num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            )
        else:
            batch = portable.PagedBatch(
                block_tables=block_tables,
                context_lens=context_lens,
                query_lens=query_lens,
                key_caches=list(caches[0::2]),
                value_caches=list(caches[1::2]),
                num_kv_heads=self.num_kv_heads,
                group=self.num_heads // self.num_kv_heads,
                head_dim=self.head_dim,
                default_scaling=self.default_scaling,
                attend_until=until,
            )
        arch = DECODERS[self.model.config.model_type]
        rope = (cpu_paged.rope_in_kernel(self.model, batch, arch.rope_half_tables)
                if self.kernel == CPU_PAGED and arch.rope_in_kernel else contextlib.nullcontext())
        adapters = contextlib.nullcontext()
        if self.lora_targets:  # inputs: mask, then per layer and target A and B (ortinf/exporter/lora.py)
            keys = [(layer, t) for layer in range(self.num_layers) for t in self.lora_targets]
            a = {key: lora[1 + 2 * i] for i, key in enumerate(keys)}
            b = {key: lora[2 + 2 * i] for i, key in enumerate(keys)}
            adapters = lora_linears(self.model, self.lora_targets, lora[0], a, b)
        legacy = has_legacy_attention(self.model)  # its base model's forward takes no ortinf_paged
        mrope = contextlib.nullcontext() if deltas is None else multimodal_rope(self.base.rotary_emb, self.mrope_section, deltas)
        with mrope, rope, traceable_moe(self.model, fused=self.kernel == CPU_PAGED), adapters, legacy_attention(self.model, batch):
            hidden = self.base(
                input_ids=input_ids[None],
                position_ids=positions[None],
                use_cache=False,
                **({} if legacy else {"ortinf_paged": batch}),
            ).last_hidden_state[0]
        logits = self.lm_head(hidden[logits_indices])
        if self.logits_scaling:
            logits = logits / self.logits_scaling
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        new_kv = [t for pair in zip(batch.new_keys, batch.new_values) for t in pair]
        assert len(new_kv) == 2 * self.num_layers, "every layer must go through the paged kernel"
        return (logits, *new_kv)


# A text config with this attribute set (ortinf/exporter/vision_language.py, Gemma 3) exports a graph whose image tokens
# attend to each other both ways at prefill: the `attend_until` input (ortinf/exporter/attention_portable.py)
IMAGE_SPANS_ATTRIBUTE = "ortinf_image_spans"


def mrope_section(config: PretrainedConfig) -> tuple[int, ...] | None:
    """Qwen2-VL's M-RoPE sections, kept in a text config's rope_scaling by ortinf/exporter/vision/qwen2_vl.py."""
    section = (getattr(config, "rope_scaling", None) or {}).get("mrope_section")
    return tuple(int(s) for s in section) if section else None


@contextlib.contextmanager
def multimodal_rope(rotary: torch.nn.Module, section: tuple[int, ...], deltas: torch.Tensor) -> Iterator[None]:
    """While tracing, the rotary embedding computes Qwen2-VL's multimodal RoPE: rotary frequency j turns by
    position component c(j) (temporal, height, width by `section`), component c being positions + deltas[c].
    transformers computes every component's table and picks sections (apply_multimodal_rotary_pos_emb); picking
    the positions first gives the same products (inv_freq[j] * position, one fp32 multiply either way), and the
    picked cos/sin [1, T, D] go on through the family's ordinary apply_rotary_pos_emb and every kernel."""
    component = torch.repeat_interleave(torch.arange(len(section)), torch.tensor(section))

    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = (position_ids[0][None, :] + deltas).float()  # [3, T]
        freqs = (positions[component] * rotary.inv_freq[:, None].float()).transpose(0, 1)  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        return (emb.cos() * rotary.attention_scaling).to(x.dtype), (emb.sin() * rotary.attention_scaling).to(x.dtype)

    original = rotary.forward
    rotary.forward = forward
    try:
        yield
    finally:
        rotary.forward = original


@contextlib.contextmanager
def paged_attention_enabled(model: PreTrainedModel, kernel: str = PORTABLE) -> Iterator[None]:
    """Switches the model to the kernel's paged attention function for the duration of tracing."""
    name, function = ATTENTION[kernel]
    AttentionInterface.register(name, function)
    previous = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = previous


def head_shape(config: PretrainedConfig) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim) of a decoder config."""
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    return num_heads, getattr(config, "num_key_value_heads", None) or num_heads, head_dim


def decoder_spec(model: PreTrainedModel, kv_dtype: str, kernel: str = PORTABLE, enable_lora: bool = False) -> DecoderSpec:
    """Shape facts of the model, read from its config."""
    config = model.config
    num_heads, num_kv_heads, head_dim = head_shape(config)
    window = getattr(config, "sliding_window", None)  # informative: the graph applies it per layer
    return DecoderSpec(
        num_layers=config.num_hidden_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        max_model_len=int(getattr(config, "max_position_embeddings", None) or config.n_positions),
        kernel=kernel,
        kv_dtype=kv_dtype,
        sliding_window=window if isinstance(window, int) else None,
        kv_layout=KV_LAYOUTS[kernel],
        lora_targets={name: list(shape) for name, shape in find_targets(model).items()} if enable_lora else {},
        mrope_section=mrope_section(config),
        image_spans=bool(getattr(config, IMAGE_SPANS_ATTRIBUTE, False)),
    )


KV_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "int8": torch.int8}


def example_inputs(spec: DecoderSpec, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Tracing inputs: 2 sequences (a 3-token prefill after 2 cached tokens, and a decode)."""
    block_size, num_blocks = 4, 6
    query_lens = torch.tensor([3, 1])
    context_lens = torch.tensor([2, 5])
    positions = torch.tensor([2, 3, 4, 5])
    input_ids = torch.tensor([1, 2, 3, 4]) % spec.vocab_size
    block_tables = torch.tensor([[3, 1], [0, 5]])
    logits_indices = torch.tensor([2, 3])
    if spec.kernel == CONTRIB_PAGED:  # the tables also cover the new tokens: 2 + 3 and 5 + 1 tokens fit 2 blocks
        shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
    else:
        shape = (spec.num_kv_heads, num_blocks, block_size, pool_row(spec))
    if spec.kv_dtype == "int8":  # the CPU kernel's rows (ortinf/kernels/cpu/attention_impl.h): never read while tracing
        caches = [torch.zeros(shape, dtype=torch.int8) for _ in range(2 * spec.num_layers)]
    else:
        caches = [torch.randn(shape, dtype=KV_TORCH_DTYPES[spec.kv_dtype]) for _ in range(2 * spec.num_layers)]
    lora = example_lora_inputs(spec.num_layers, spec.lora_targets, len(input_ids), dtype) if spec.lora_targets else []
    deltas = [torch.tensor([[0, 0, -3, -3], [0, 1, -2, -3], [0, 2, -1, -3]])] if spec.mrope_section else []
    until = [torch.tensor([3, 3, 4, 5])] if spec.image_spans else []  # the first two prefill tokens see each other
    return (input_ids, positions, block_tables, context_lens, query_lens, logits_indices, *caches, *lora, *deltas, *until)


def trace_decoder(model: PreTrainedModel, spec: DecoderSpec, path: Path, dtype: torch.dtype,
                  attention: str | None = None) -> tuple[list[str], list[str]]:
    """Traces the paged decoder to `path` (logits and the new K/V out) with `attention` (default: the
    package's kernel); returns the graph's input and output names. ortinf/exporter/kv_write.py then derives
    the package's graphs from it."""
    attention = attention or spec.kernel
    cache_inputs, cache_outputs = cache_names(spec.num_layers)
    # the contrib op writes the pool itself: its outputs are the pools; the portable kernel's are the new K/V
    kv_outputs = cache_outputs if spec.kernel == CONTRIB_PAGED else new_kv_names(spec.num_layers)
    inputs = [*INPUTS_HEAD, *cache_inputs, *(lora_input_names(spec.num_layers, spec.lora_targets) if spec.lora_targets else ()),
              *((MROPE_DELTAS,) if spec.mrope_section else ()), *((ATTEND_UNTIL,) if spec.image_spans else ())]
    outputs = [LOGITS, *kv_outputs]
    dynamic_axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "num_tokens"},
        "positions": {0: "num_tokens"},
        "block_tables": {0: "num_seqs", 1: "max_blocks"},
        "context_lens": {0: "num_seqs"},
        "query_lens": {0: "num_seqs"},
        "logits_indices": {0: "num_seqs"},
        "logits": {0: "num_seqs"},
    }
    for name in cache_inputs:
        dynamic_axes[name] = {1: "num_blocks", 2: "block_size"}
    for name in kv_outputs:
        dynamic_axes[name] = {0: "num_blocks", 1: "block_size"} if spec.kernel == CONTRIB_PAGED else {0: "num_tokens"}
    for name in cache_inputs if spec.kernel == CONTRIB_PAGED else ():
        dynamic_axes[name] = {0: "num_blocks", 1: "block_size"}
    dynamic_axes.update(lora_dynamic_axes(spec.num_layers, spec.lora_targets) if spec.lora_targets else {})
    if spec.mrope_section:
        dynamic_axes[MROPE_DELTAS] = {1: "num_tokens"}
    if spec.image_spans:
        if attention not in (PORTABLE, CPU_PAGED):
            raise ExportError(f"{model.config.model_type}'s image tokens attend both ways, which the portable kernel and "
                              "ortinf's CPU kernel draw: export with --kernel portable")
        dynamic_axes[ATTEND_UNTIL] = {0: "num_tokens"}
    wrapper = PagedDecoder(model, attention, spec.lora_targets).eval()
    with paged_attention_enabled(model, attention), torch.no_grad(), quiet_tracing(), no_graph_shape_inference():
        torch.onnx.export(
            wrapper,
            example_inputs(spec, dtype),
            str(path),
            dynamo=False,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            do_constant_folding=True,
            custom_opsets={cpu_paged.DOMAIN: 1} if attention == CPU_PAGED else None,
        )
    if spec.image_spans and attention == CPU_PAGED:
        give_spans_to_cpu_op(path)
    return inputs, outputs


def give_spans_to_cpu_op(path: Path) -> None:
    """The CPU graph's image spans: `attend_until` (dropped by the trace, which the op's Python stand-in does not
    read) as the graph input and each ortinf.PagedAttention node's input 11 (omitted optional inputs before it
    left empty, as ONNX writes them)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    if ATTEND_UNTIL not in {i.name for i in graph.input}:
        graph.input.append(helper.make_tensor_value_info(ATTEND_UNTIL, TensorProto.INT64, ["num_tokens"]))
    for node in graph.node:
        if node.domain == cpu_paged.DOMAIN and node.op_type == cpu_paged.OP:
            node.input.extend([""] * (11 - len(node.input)) + [ATTEND_UNTIL])
    onnx.save_model(model, str(path))
