"""Text encoder-decoders (Marian translation, BART) on Whisper's machinery (ortinf/exporter/whisper.py): the
same paged decoder with cross-attention K/V in pool blocks of their own, an encoder over token ids
instead of log-mel features.

    encoder.onnx   input_ids [B, S], attention_mask [B, S]
                   -> cross_key.{i}, cross_value.{i} [B, S, heads, head_dim] per decoder layer
    model.onnx     Whisper's decoder contract (cross_block_tables, cross_lens: each sequence's own
                   source length, so sources of any length share one call)

What differs from Whisper is only how the decoder is called: BART's and Marian's take the step's
positions as `cache_position` (learned positions offset by 2 for BART, sinusoidal for Marian), scale
their embeddings, and add `final_logits_bias` to the LM head. transformers gives both the attention
interface, so the self-attention is the portable paged kernel and the cross-attention the gather over
cross blocks, as for Whisper. The runtime is runtime/seq2seq.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from transformers import AttentionInterface

from ortinf.exporter.config import ExportConfig
from ortinf.exporter.cross_decoder import ATTENTION_NAME, PagedCrossDecoder, decoder_dims, self_attention, trace_decoder
from ortinf.exporter.t5 import T5_TYPES, PagedT5Decoder, T5EncoderGraph
from ortinf.exporter.tracing import OPSET, quiet_tracing

SEQ2SEQ_CLASSES = {"marian": "MarianMTModel", "bart": "BartForConditionalGeneration", "t5": "T5ForConditionalGeneration",
                   "mt5": "MT5ForConditionalGeneration"}
T5_MAX_POSITIONS = 512  # T5 has no position table (relative buckets): the length it was trained at, unless n_positions says


class TextEncoderGraph(torch.nn.Module):
    """input_ids, attention_mask -> every decoder layer's cross-attention K and V."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = model.get_encoder()
        self.cross = torch.nn.ModuleList(layer.encoder_attn for layer in model.get_decoder().layers)
        self.heads = model.config.decoder_attention_heads
        self.head_dim = model.config.d_model // self.heads

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        shape = (hidden.shape[0], -1, self.heads, self.head_dim)
        outputs = []
        for attention in self.cross:
            outputs += [attention.k_proj(hidden).reshape(shape), attention.v_proj(hidden).reshape(shape)]
        return tuple(outputs)


class PagedTextDecoder(PagedCrossDecoder):
    """Whisper's paged decoder step for BART and Marian decoders."""

    def run_decoder(self, input_ids: torch.Tensor, positions: torch.Tensor, dummy: torch.Tensor) -> torch.Tensor:
        return self.decoder(input_ids=input_ids[None], cache_position=positions, encoder_hidden_states=dummy,
                            use_cache=False).last_hidden_state[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.lm_head(hidden)
        bias = getattr(self.model, "final_logits_bias", None)
        return logits if bias is None else logits + bias


def export_seq2seq_graphs(model: torch.nn.Module, folder: Path) -> None:
    """Traces encoder.onnx and model.onnx (host write: the decoder returns its new K/V) into `folder`."""
    config = model.config
    AttentionInterface.register(ATTENTION_NAME, self_attention)
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    layers, _, _ = decoder_dims(config)
    t5 = config.model_type in T5_TYPES  # its own encoder outputs and decoder step (ortinf/exporter/t5.py)
    try:
        with torch.no_grad(), quiet_tracing():
            names = [f"cross_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
            ids, mask = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]]), torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
            encoder = T5EncoderGraph(model) if t5 else TextEncoderGraph(model)
            torch.onnx.export(encoder.eval(), (ids, mask), str(folder / "encoder.onnx"), dynamo=False,
                              input_names=["input_ids", "attention_mask"], output_names=names, opset_version=OPSET,
                              dynamic_axes={"input_ids": {0: "batch", 1: "source"}, "attention_mask": {0: "batch", 1: "source"},
                                            **{n: {0: "batch", 1: "source"} for n in names}})
            trace_decoder(PagedT5Decoder(model) if t5 else PagedTextDecoder(model), config, folder / "model.onnx")
    finally:
        config._attn_implementation = previous


def check_text_pool(encoder: object, decoder: object, model: torch.nn.Module, sources: list[list[int]], steps: int,
                    block_size: int = 4) -> float:
    """Encoder on ragged sources (one padded batch), cross K/V written into shuffled pool blocks by
    numpy, then the decoder start and greedy steps of all sequences together through the host-write
    graph; the max abs logit difference against transformers over every call."""
    from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

    config = model.config
    layers, heads, head_dim = decoder_dims(config)
    longest = max(len(s) for s in sources)
    ids = np.array([s + [config.pad_token_id] * (longest - len(s)) for s in sources], np.int64)
    mask = np.array([[1] * len(s) + [0] * (longest - len(s)) for s in sources], np.int64)
    cross = encoder.run(None, {"input_ids": ids, "attention_mask": mask})
    cross_blocks = -(-longest // block_size)
    self_blocks = -(-(steps + 1) // block_size)
    num_blocks = len(sources) * (cross_blocks + self_blocks)
    pools = [np.zeros((heads, num_blocks, block_size, head_dim), np.float32) for _ in range(2 * layers)]
    order = np.random.default_rng(7).permutation(num_blocks).tolist()
    cross_tables = [order[r * cross_blocks : (r + 1) * cross_blocks] for r in range(len(sources))]
    base = len(sources) * cross_blocks
    self_tables = [order[base + r * self_blocks : base + (r + 1) * self_blocks] for r in range(len(sources))]

    def write(pool: np.ndarray, slots: np.ndarray, values: np.ndarray) -> None:
        pool.reshape(heads, -1, head_dim)[:, slots] = values.swapaxes(0, 1)

    for r, (source, table) in enumerate(zip(sources, cross_tables)):
        slots = np.array([table[p // block_size] * block_size + p % block_size for p in range(len(source))])
        for index, pool in enumerate(pools):
            write(pool, slots, cross[index][r, : len(source)])
    tokens = [[config.decoder_start_token_id] for _ in sources]
    done = [0] * len(sources)
    worst = 0.0
    for _ in range(steps):
        step = build_model_input([SequenceChunk(t[d:], d, table) for t, d, table in zip(tokens, done, self_tables)], block_size)
        feeds = {k: v for k, v in step.feeds().items() if k != "slot_mapping"}
        feeds.update(cross_block_tables=np.array(cross_tables, np.int64), cross_lens=np.array([len(s) for s in sources], np.int64))
        feeds.update({f"{kind}_cache.{i}": pools[2 * i + (kind == "value")] for i in range(layers) for kind in ("key", "value")})
        logits, *new_kv = decoder.run(None, feeds)
        for index, pool in enumerate(pools):
            write(pool, step.slot_mapping, new_kv[index])
        for r, source in enumerate(sources):
            with torch.no_grad():
                ref = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([tokens[r]])).logits[0, -1].float().numpy()
            worst = max(worst, float(np.abs(logits[r] - ref).max()))
            done[r] = len(tokens[r])
            tokens[r].append(int(ref.argmax()))
    return worst


def export_seq2seq(source, out_path: Path, config: ExportConfig, tolerance: float):
    """A text2text-generation package (Marian, BART): encoder.onnx, the paged decoder (model.onnx with
    the KV write, and the host-write graph), tokenizer, generation config, and a manifest with the
    parity of a ragged batch against transformers. fp32. Options: `config` (ortinf/exporter/config.py)."""
    overwrite, progress = config.overwrite, config.progress
    import shutil

    import onnx
    import onnxruntime
    import transformers
    from tqdm.auto import tqdm

    from ortinf.errors import ExportError
    from ortinf.exporter.kv_write import place_decoder
    from ortinf.exporter.package import staging, token_ids, versions, write_generation_config, write_tokenizer
    from ortinf.manifest import (
        ENCODER_MODEL_NAME,
        HOST_WRITE_MODEL_NAME,
        PORTABLE,
        TEXT2TEXT,
        DecoderSpec,
        Manifest,
        Parity,
        Seq2SeqSpec,
    )

    with staging(out_path, overwrite) as stage:
        has_tokenizer, _ = write_tokenizer(source, stage, source.config.get("vocab_size"))
        try:
            model_class = getattr(transformers, SEQ2SEQ_CLASSES[source.model_type])
            model = model_class.from_pretrained(source.path, dtype=torch.float32, attn_implementation="eager").eval()
        except Exception as exc:  # user-facing
            raise ExportError(f"cannot load {source.name}: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}") from exc
        bar = tqdm(total=3, desc="tracing", disable=not progress)  # after loading: a load error is the only line
        config = model.config
        trace = stage / ".trace"
        trace.mkdir()
        export_seq2seq_graphs(model, trace)
        bar.update()
        layers, heads, head_dim = decoder_dims(config)
        max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or T5_MAX_POSITIONS
        spec = DecoderSpec(num_layers=layers, num_heads=heads, num_kv_heads=heads, head_dim=head_dim,
                           hidden_size=config.d_model, vocab_size=model.get_output_embeddings().weight.shape[0],
                           max_model_len=max_positions, kernel=PORTABLE, kv_dtype="fp32")
        inputs, outputs = place_decoder(trace / "model.onnx", stage, spec)
        encoder = onnx.load(str(trace / ENCODER_MODEL_NAME), load_external_data=True)
        onnx.save_model(encoder, str(stage / ENCODER_MODEL_NAME), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=ENCODER_MODEL_NAME + ".data", size_threshold=1024)
        shutil.rmtree(trace)
        generation = write_generation_config(source, stage)
        seq2seq = Seq2SeqSpec(max_source_positions=max_positions,
                              decoder_start_token_id=int(config.decoder_start_token_id))
        manifest = Manifest(task=TEXT2TEXT, architecture=type(model).__name__, model_type=source.model_type, dtype="fp32",
                            inputs=tuple(inputs), outputs=tuple(outputs),
                            eos_token_ids=token_ids(generation.get("eos_token_id", config.eos_token_id)),
                            bos_token_id=generation.get("bos_token_id", config.bos_token_id),
                            pad_token_id=generation.get("pad_token_id", config.pad_token_id), decoder=spec, seq2seq=seq2seq,
                            has_tokenizer=has_tokenizer, source=str(source.name), versions=versions())
        bar.update()
        bar.set_description_str("verifying")
        sessions = [onnxruntime.InferenceSession(str(stage / name), providers=["CPUExecutionProvider"])
                    for name in (ENCODER_MODEL_NAME, HOST_WRITE_MODEL_NAME)]
        rng = np.random.default_rng(1234)
        sources = [rng.integers(3, config.vocab_size, n).tolist() + [config.eos_token_id] for n in (9, 3)]
        worst = check_text_pool(sessions[0], sessions[1], model, sources, steps=8)
        description = "encoder on 2 ragged sources (10 and 4 tokens, one padded batch); decoder: 8 greedy steps together, shuffled blocks, on cpu"
        if not worst <= tolerance:
            raise ExportError(f"verification failed: max abs difference {worst:.3g} vs PyTorch is above the tolerance {tolerance:g} "
                              f"({description}); nothing was written")
        manifest = dataclasses.replace(manifest, parity=Parity(worst, tolerance, description))
        manifest.save(stage)
        bar.update()
        bar.close()
    return manifest
