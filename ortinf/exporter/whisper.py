"""Whisper (encoder-decoder speech recognition) on the paged contract: two graphs.

    encoder.onnx   input_features -> cross_key.{i}, cross_value.{i} per decoder layer (once per window)
    model.onnx     the text decoders' paged inputs plus cross_block_tables [S, cross_blocks] and cross_lens [S]

The cross-attention K/V live in the same per-layer paged pool as the self-attention K/V, in blocks of their own.
The paged decoder itself is ortinf/exporter/cross_decoder.py, which BART and Marian share; this module is
Whisper's encoder graph, its export and its verification. The runtime runs windows as requests of the one engine
(ortinf/tasks/speech/windows.py).

The design (the graphs' inputs and outputs, why the cross K/V live in the pool): docs/speech.md, "The package"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import AttentionInterface

from ortinf.exporter.config import ExportConfig
from ortinf.exporter.cross_decoder import ATTENTION_NAME, PagedCrossDecoder, self_attention, trace_decoder
from ortinf.exporter.tracing import OPSET, quiet_tracing
from ortinf.exporter.whisper_alignment import alignment_heads, check_alignment, export_alignment_graph


class WhisperEncoderGraph(torch.nn.Module):
    """input_features -> every decoder layer's cross-attention K and V."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = model.model.encoder
        self.cross = torch.nn.ModuleList(layer.encoder_attn for layer in model.model.decoder.layers)
        self.heads = model.config.decoder_attention_heads
        self.head_dim = model.config.d_model // self.heads

    def forward(self, input_features: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.encoder(input_features).last_hidden_state  # [B, P, d_model]
        shape = (hidden.shape[0], -1, self.heads, self.head_dim)
        outputs = []
        for attention in self.cross:
            outputs += [attention.k_proj(hidden).reshape(shape), attention.v_proj(hidden).reshape(shape)]
        return tuple(outputs)


def export_whisper_graphs(model: torch.nn.Module, folder: Path, cpu_graph: bool = False) -> None:
    """Traces encoder.onnx and model.onnx (the decoder returns its new K/V: host write) into `folder`,
    and with `cpu_graph` model.cpu.onnx, the decoder for ortinf's CPU kernel library."""
    config = model.config
    AttentionInterface.register(ATTENTION_NAME, self_attention)
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    layers = config.decoder_layers
    try:
        with torch.no_grad(), quiet_tracing():
            features = torch.randn(1, config.num_mel_bins, 2 * config.max_source_positions)
            names = [f"cross_{kind}.{i}" for i in range(layers) for kind in ("key", "value")]
            torch.onnx.export(WhisperEncoderGraph(model).eval(), (features,), str(folder / "encoder.onnx"), dynamo=False,
                              input_names=["input_features"], output_names=names,
                              dynamic_axes={"input_features": {0: "batch"}, **{n: {0: "batch"} for n in names}}, opset_version=OPSET)
            trace_decoder(PagedCrossDecoder(model), config, folder / "model.onnx")
    finally:
        config._attn_implementation = previous
    if cpu_graph:  # the same step for ortinf's CPU kernel library (ortinf/exporter/whisper_cpu.py)
        from ortinf.exporter.whisper_cpu import export_cpu_decoder

        export_cpu_decoder(model, folder / "model.cpu.onnx")


def step_through_pool(encoder: object, decoder: object, model: torch.nn.Module, features: np.ndarray, prompts: list[list[int]],
                      steps: int, block_size: int = 4, graph_write: bool = False, pairs: list | None = None) -> float:
    """Runs the encoder graph, writes each request's cross K/V into pool blocks of its own (numpy),
    then prefill and greedy decode steps of all requests together through the host-write decoder
    graph; returns the max abs logit difference against transformers over every call. `encoder` and
    `decoder` are onnxruntime sessions."""
    from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

    config = model.config
    layers, heads = config.decoder_layers, config.decoder_attention_heads
    head_dim, positions = config.d_model // heads, config.max_source_positions
    cross = encoder.run(None, {"input_features": features})  # per layer K, V: [B, P, H, D]
    requests = len(prompts)
    cross_blocks = -(-positions // block_size)
    self_blocks = -(-(max(len(p) for p in prompts) + steps) // block_size)
    num_blocks = requests * (cross_blocks + self_blocks)
    pools = [np.zeros((heads, num_blocks, block_size, head_dim), np.float32) for _ in range(2 * layers)]
    order = np.random.default_rng(1234).permutation(num_blocks).tolist()  # shuffled, non-contiguous blocks
    cross_tables = [order[r * cross_blocks : (r + 1) * cross_blocks] for r in range(requests)]
    base = requests * cross_blocks
    self_tables = [order[base + r * self_blocks : base + (r + 1) * self_blocks] for r in range(requests)]

    def write(pool: np.ndarray, slots: np.ndarray, values: np.ndarray) -> None:  # values [T, H, D], as KVPool.write
        pool.reshape(heads, -1, head_dim)[:, slots] = values.swapaxes(0, 1)

    for request, table in enumerate(cross_tables):
        slots = np.array([table[p // block_size] * block_size + p % block_size for p in range(positions)])
        for index, pool in enumerate(pools):
            write(pool, slots, cross[index][request])
    tokens = [list(p) for p in prompts]
    done = [0] * requests
    worst = 0.0
    for _ in range(steps):
        chunks = [SequenceChunk(t[d:], d, table) for t, d, table in zip(tokens, done, self_tables)]
        step_input = build_model_input(chunks, block_size)
        feeds = {k: v for k, v in step_input.feeds().items() if graph_write or k != "slot_mapping"}
        feeds.update(cross_block_tables=np.array(cross_tables, np.int64), cross_lens=np.full(requests, positions, np.int64))
        feeds.update({f"{kind}_cache.{i}": pools[2 * i + (kind == "value")] for i in range(layers) for kind in ("key", "value")})
        logits, *new_kv = decoder.run(None, feeds)
        if graph_write:  # the graph returns the pools it wrote into (in the runtime, in place)
            pools = [new_kv[index] for index in range(2 * layers)]
        else:
            for index, pool in enumerate(pools):
                write(pool, step_input.slot_mapping, new_kv[index])
        for request in range(requests):
            with torch.no_grad():
                ref = model(input_features=torch.from_numpy(features[request : request + 1]),
                            decoder_input_ids=torch.tensor([tokens[request]])).logits[0, -1].float().numpy()
            worst = max(worst, float(np.abs(logits[request] - ref).max()))
            if pairs is not None:  # (package, reference) logits of every step, for the quality figures
                pairs.append((request, logits[request].copy(), ref))
            done[request] = len(tokens[request])
            tokens[request].append(int(ref.argmax()))
    return worst


def pool_write_encoder(encoder, layers: int, heads: int, head_dim: int):  # onnx ModelProto in and out
    """encoder.onnx with the in-graph KV write (ortinf/exporter/kv_write.py): the pool tensors in, each layer's
    cross K/V scattered into the slots `slot_mapping` names (the windows' cross blocks, window after
    window, position after position), the pools out, bound in place. For providers whose pool is
    device memory (WebGPU, CUDA): the cross K/V never come back to the host."""
    from onnx import TensorProto, helper, numpy_helper

    from ortinf.exporter.kv_write import add_kv_write
    from ortinf.manifest import cache_names, new_kv_names

    graph = encoder.graph
    crossed = [o.name for o in graph.output]
    graph.initializer.append(numpy_helper.from_array(np.array([-1, heads, head_dim], dtype=np.int64), "pw.rows"))
    for name, new in zip(crossed, new_kv_names(layers)):  # [B, P, H, D] -> [B * P, H, D], the write's layout
        graph.node.append(helper.make_node("Reshape", [name, "pw.rows"], [new]))
    del graph.output[:]
    graph.output.extend(helper.make_tensor_value_info(new, TensorProto.FLOAT, ["rows", heads, head_dim]) for new in new_kv_names(layers))
    graph.input.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, [heads, "num_blocks", "block_size", head_dim])
                       for name in cache_names(layers)[0])
    add_kv_write(encoder, layers, heads)
    return encoder


def speech_quality(pairs: list, dtype: str):  # a Manifest Quality
    """Quality of a quantized package from step_through_pool's logits (teacher-forced by the fp32
    reference): top-1 agreement and mean KL per step, and per request the share of steps before its
    first argmax difference (greedy agreement)."""
    from ortinf.exporter.verify import THRESHOLDS
    from ortinf.manifest import Quality

    agree, kls, firsts = [], [], {}
    for index, (request, ours, ref) in enumerate(pairs):
        ref_log = ref.astype(np.float64) - np.logaddexp.reduce(ref.astype(np.float64))
        our_log = ours.astype(np.float64) - np.logaddexp.reduce(ours.astype(np.float64))
        agree.append(int(ours.argmax() == ref.argmax()))
        kls.append(float((np.exp(ref_log) * (ref_log - our_log)).sum()))
        steps = firsts.setdefault(request, [0, 0, True])
        steps[1] += 1
        if steps[2] and agree[-1]:
            steps[0] += 1
        else:
            steps[2] = False
    low_top1, high_kl, low_greedy = THRESHOLDS[dtype]
    return Quality(top1_agreement=float(np.mean(agree)), mean_kl=float(np.mean(kls)),
                   greedy_agreement=float(np.mean([a / n for a, n, _ in firsts.values()])), min_top1_agreement=low_top1,
                   max_mean_kl=high_kl, min_greedy_agreement=low_greedy,
                   description=f"{len(firsts)} random audios, {len(pairs) // max(len(firsts), 1)} decoder steps each (teacher-forced "
                               "by the fp32 model), on cpu")


def export_whisper(source, out_path: Path, config: ExportConfig, tolerance: float):
    """A Whisper package: encoder.onnx, the paged decoder (model.onnx with the KV write, and the
    host-write graph), the mel filter bank, the tokenizer and generation config, and a manifest with
    the parity of a ragged two-request batch against transformers. `dtype` int8/int4: the encoder's
    and decoder's MatMul weights as MatMulNBits (ortinf/exporter/quantize.py), verified by quality figures
    against the fp32 model instead of a tolerance. Options: `config` (ortinf/exporter/config.py)."""
    import dataclasses
    import shutil

    import onnx
    import onnxruntime
    import transformers
    from tqdm.auto import tqdm

    from ortinf.errors import ExportError
    from ortinf.exporter.kv_write import digest, place_decoder, share_weights
    from ortinf.exporter.package import staging, token_ids, write_generation_config, write_tokenizer
    from ortinf.exporter.quantize import BITS

    overwrite, progress, dtype, quality_gate = config.overwrite, config.progress, config.dtype or "fp32", config.quality_gate
    quant_block_size, accuracy_level = config.block_size, config.accuracy_level
    from ortinf.manifest import (
        ALIGNMENT_MODEL_NAME,
        CPU_MODEL_NAME,
        ENCODER_MODEL_NAME,
        ENCODER_WRITE_MODEL_NAME,
        HOST_WRITE_MODEL_NAME,
        MEL_FILTERS_NAME,
        PORTABLE,
        SPEECH_RECOGNITION,
        CpuKernel,
        DecoderSpec,
        Manifest,
        Parity,
        Quantization,
        SpeechSpec,
    )

    bar = tqdm(total=3, desc="tracing", disable=not progress)
    with staging(out_path, overwrite) as stage:
        has_tokenizer, _ = write_tokenizer(source, stage, source.config.get("vocab_size"))
        try:
            model = transformers.WhisperForConditionalGeneration.from_pretrained(source.path, dtype=torch.float32,
                                                                                 attn_implementation="eager").eval()
        except Exception as exc:  # user-facing
            raise ExportError(f"cannot load {source.name} as Whisper: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}") from exc
        config = model.config
        trace = stage / ".trace"
        trace.mkdir()
        from ortinf.exporter.attention_cpu import wants_cpu_graph

        cpu_graph = wants_cpu_graph(PORTABLE, "fp32")
        export_whisper_graphs(model, trace, cpu_graph)
        heads_used = alignment_heads(model)
        export_alignment_graph(model, heads_used, trace / ALIGNMENT_MODEL_NAME)
        bar.update()
        heads = config.decoder_attention_heads
        spec = DecoderSpec(num_layers=config.decoder_layers, num_heads=heads, num_kv_heads=heads, head_dim=config.d_model // heads,
                           hidden_size=config.d_model, vocab_size=config.vocab_size, max_model_len=config.max_target_positions,
                           kernel=PORTABLE, kv_dtype="fp32")
        transform = None
        if dtype != "fp32":
            from ortinf.exporter.quantize import quantize

            transform = lambda graph: quantize(graph, dtype, quant_block_size, accuracy_level)  # noqa: E731
        inputs, outputs = place_decoder(trace / "model.onnx", stage, spec, transform,
                                        cpu_traced=trace / "model.cpu.onnx" if cpu_graph else None)
        # the alignment graph's weights are the decoder's: it points into model.onnx.data
        shared = onnx.load(str(stage / HOST_WRITE_MODEL_NAME), load_external_data=True)
        decoder_digests = {digest(t): t.name for t in shared.graph.initializer if len(t.raw_data) >= 1024}
        aligner = onnx.load(str(trace / ALIGNMENT_MODEL_NAME), load_external_data=True)
        share_weights(aligner, onnx.load(str(stage / HOST_WRITE_MODEL_NAME), load_external_data=False), decoder_digests)
        del shared
        onnx.save_model(aligner, str(stage / ALIGNMENT_MODEL_NAME), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=ALIGNMENT_MODEL_NAME + ".data", size_threshold=1024)  # what matched nothing, if anything
        saved = {}
        for name in (ENCODER_MODEL_NAME,):
            graph = onnx.load(str(trace / name), load_external_data=True)
            graph = transform(graph) if transform is not None else graph
            digests = {digest(t): t.name for t in graph.graph.initializer if len(t.raw_data) >= 1024}
            onnx.save_model(graph, str(stage / name), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=name + ".data", size_threshold=1024)  # leaves `graph` referring to its data file
            saved[name] = graph, digests
        # the encoder with the pool write, for device pools; its weights are encoder.onnx.data's
        writer = onnx.load(str(trace / ENCODER_MODEL_NAME), load_external_data=True)
        writer = pool_write_encoder(transform(writer) if transform is not None else writer, config.decoder_layers, heads,
                                    config.d_model // heads)
        share_weights(writer, *saved[ENCODER_MODEL_NAME])
        onnx.save_model(writer, str(stage / ENCODER_WRITE_MODEL_NAME))
        shutil.rmtree(trace)
        preprocessor = source.path / "preprocessor_config.json"
        extractor = (transformers.WhisperFeatureExtractor.from_pretrained(source.path) if preprocessor.is_file()
                     else transformers.WhisperFeatureExtractor(feature_size=config.num_mel_bins))
        if extractor.feature_size != config.num_mel_bins:
            raise ExportError(f"{preprocessor} has {extractor.feature_size} mel bins; the model takes {config.num_mel_bins}")
        np.save(stage / MEL_FILTERS_NAME, extractor.mel_filters.astype(np.float32))
        generation = write_generation_config(source, stage)
        speech = SpeechSpec(num_mel_bins=config.num_mel_bins, source_positions=config.max_source_positions,
                            window_samples=int(extractor.n_samples), decoder_start_token_id=int(config.decoder_start_token_id),
                            alignment_graph=ALIGNMENT_MODEL_NAME, encoder_write_graph=ENCODER_WRITE_MODEL_NAME, alignment_heads=tuple(heads_used),
                            median_filter_width=int(getattr(config, "median_filter_width", 7)))
        from ortinf.exporter.package import versions

        quantized = dtype != "fp32"
        manifest = Manifest(task=SPEECH_RECOGNITION, architecture="WhisperForConditionalGeneration", model_type="whisper", dtype=dtype,
                            inputs=tuple(inputs), outputs=tuple(outputs),
                            eos_token_ids=token_ids(generation.get("eos_token_id", config.eos_token_id)),
                            bos_token_id=generation.get("bos_token_id", config.bos_token_id),
                            pad_token_id=generation.get("pad_token_id", config.pad_token_id), decoder=spec, speech=speech,
                            has_tokenizer=has_tokenizer, source=str(source.name), versions=versions(),
                            quantization=Quantization(BITS[dtype], quant_block_size, accuracy_level)
                            if quantized else None)
        bar.update()
        bar.set_description_str("verifying")
        sessions = [onnxruntime.InferenceSession(str(stage / name), providers=["CPUExecutionProvider"])
                    for name in (ENCODER_MODEL_NAME, HOST_WRITE_MODEL_NAME, "model.onnx")]
        rng = np.random.default_rng(1234)
        features = rng.standard_normal((2, config.num_mel_bins, 2 * config.max_source_positions)).astype(np.float32)
        start = int(config.decoder_start_token_id)
        prompts = [[start, *rng.integers(3, config.vocab_size, 6).tolist()], [start]]
        steps, pairs, fused_pairs = (16, [], []) if quantized else (8, None, None)
        worst = step_through_pool(sessions[0], sessions[1], model, features, prompts, steps=steps, pairs=pairs)
        cpu_kernel = None
        if cpu_graph:  # model.cpu.onnx, with its in-graph KV write, through the same steps
            from ortinf.exporter import attention_cpu as cpu_paged
            from ortinf.kernels import library

            options = onnxruntime.SessionOptions()
            library.register(options)
            fused = onnxruntime.InferenceSession(str(stage / CPU_MODEL_NAME), options, providers=["CPUExecutionProvider"])
            error = step_through_pool(sessions[0], fused, model, features, prompts, steps=steps, graph_write=True, pairs=fused_pairs)
            if not error <= tolerance:
                raise ExportError(f"verification failed: the CPU-kernel decoder differs from PyTorch by {error:.3g}, above {tolerance:g}")
            cpu_kernel = CpuKernel(CPU_MODEL_NAME, cpu_paged.DOMAIN, (cpu_paged.OP,), error,
                                   "the same two requests, prefill then 8 greedy steps, in-graph KV write; on cpu")
        aligner = onnxruntime.InferenceSession(str(stage / ALIGNMENT_MODEL_NAME), providers=["CPUExecutionProvider"])
        worst = max(worst, check_alignment(sessions[0], aligner, model, features[:1], prompts[0], heads_used))
        description = ("encoder on 2 random inputs; decoder: a 7- and a 1-token prompt, then 8 greedy steps together, shuffled blocks; "
                       "alignment heads' cross-attention of the 7 tokens; on cpu")
        if not worst <= tolerance:
            raise ExportError(f"verification failed: max abs difference {worst:.3g} vs PyTorch is above the tolerance {tolerance:g} "
                              f"({description}); nothing was written")
        manifest = dataclasses.replace(manifest, parity=Parity(worst, tolerance, description), cpu_kernel=cpu_kernel)
        if quantized:  # against the fp32 model: the portable graph's figures, and the CPU graph's gates too
            from ortinf.exporter.verify import gate

            quality = speech_quality(pairs, dtype)
            fused = speech_quality(fused_pairs, dtype).failures() if fused_pairs else []
            quality = gate(quality, quality_gate, "Try --dtype int8, or --accuracy-level 0", fused)
            manifest = dataclasses.replace(manifest, quality=quality)
        manifest.save(stage)
        bar.update()
        bar.close()
    return manifest
