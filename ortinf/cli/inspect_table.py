"""Rows of `ortinf inspect`: a package's manifest as readable key/value pairs."""

from __future__ import annotations

import math
from pathlib import Path

from ortinf.manifest import Manifest
from ortinf.providers.registry import PROVIDERS


def _size(folder: Path) -> str:
    total = sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name.startswith("model.") and ".onnx" in p.name)
    return f"{total / 2**20:.1f} MiB"


def cpu_kernel_row(manifest: Manifest) -> str:
    """Which attention kernel the CPU provider runs for this package here, and why."""
    from ortinf.kernels import library

    kernel = manifest.cpu_kernel
    if kernel is None:
        return f"{manifest.decoder.kernel} (the package has no graph for ortinf's CPU kernel library)"
    loaded = library.load()
    ops = "/".join(f"{kernel.domain}.{op}" for op in kernel.ops)
    if loaded is None:
        return f"portable: {kernel.graph} ({ops}) needs ortinf's kernel library, which is not loaded here"
    isa = f"attention {loaded.isa}"
    if "QMatMul" in kernel.ops:
        isa += f", QMatMul {library.qmatmul_isa()}"
    if "BMatMul" in kernel.ops:
        isa += f", BMatMul {library.panel_gemm_isa()}"
    return f"{ops} ({isa}) in {kernel.graph}, max abs diff vs PyTorch {kernel.max_abs_diff:.2e}"


def manifest_rows(manifest: Manifest, folder: Path) -> list[tuple[str, str]]:
    """(key, value) rows, most useful first."""
    rows = [
        ("task", manifest.task),
        ("architecture", f"{manifest.architecture} ({manifest.model_type})"),
        ("dtype", manifest.dtype),
        ("graph size", _size(folder)),
    ]
    if manifest.decoder is not None:
        d = manifest.decoder
        rows += [
            ("layers", str(d.num_layers)),
            ("heads / kv heads", f"{d.num_heads} / {d.num_kv_heads} (head dim {d.head_dim})"),
            ("hidden size", str(d.hidden_size)),
            ("vocab size", str(d.vocab_size)),
            ("max model len", str(d.max_model_len)),
            ("sliding window", str(d.sliding_window or "none")),
            ("attention kernel", f"{d.kernel} (runs on {', '.join(n for n, p in PROVIDERS.items() if d.kernel in p.kernels)})"),
            ("kv cache", f"{d.kv_dtype}, layout [{d.kv_layout}] per layer" + (
                f"; {manifest.cpu_kernel.kv_dtype} (rows of head_dim + 4 bytes) in {manifest.cpu_kernel.graph}"
                if manifest.cpu_kernel is not None and manifest.cpu_kernel.kv_dtype else "")),
            ("cpu kernel", cpu_kernel_row(manifest)),
            ("lora", f"inputs on {', '.join(d.lora_targets)} (serve adapters with --lora-modules)" if d.lora_targets
             else "none (export with --enable-lora to serve adapters)"),
        ]
    if manifest.vision is not None:
        v = manifest.vision
        tokens = f"{v.tokens_per_image} tokens per image" if v.tokens_per_image else "tokens by each image's size"
        rows += [
            ("vision", f"{v.family} image encoder, {v.dtype} weights, {tokens}, image token {v.image_token_id}"
                       + (f"; max abs diff vs transformers {v.max_abs_diff:.2e}" if not math.isnan(v.max_abs_diff) else "")),
            ("run it with", "chat messages with image_url parts / LLM(package).chat / LLM.generate(multi_modal_data={'image': ...})"),
        ]
    if manifest.speech is not None:
        sp = manifest.speech
        rows += [
            ("speech encoder", f"{sp.encoder_graph}: {sp.num_mel_bins} mel bins, {sp.window_samples / 16000:.0f} s windows, "
                               f"{sp.source_positions} cross-attention positions (in pool blocks of their own)"),
            ("run it with", "ortinf transcribe / LLM(package).transcribe / /v1/audio/transcriptions"),
        ]
    if manifest.seq2seq is not None:
        rows += [
            ("text encoder", f"{manifest.seq2seq.encoder_graph}: up to {manifest.seq2seq.max_source_positions} source tokens "
                             "(cross-attention K/V in pool blocks of their own)"),
            ("run it with", "LLM(package).text2text(texts or token ids)"),
        ]
    if manifest.encoder is not None:
        e = manifest.encoder
        rows += [("hidden size", str(e.hidden_size)), ("max model len", str(e.max_model_len))]
        if e.pooling:
            rows += [("pooling", f"{e.pooling}{', normalized' if e.normalize else ''}"), ("embedding dim", str(e.embedding_dim))]
        if e.labels:
            rows.append(("labels", ", ".join(e.labels)))
    rows += [
        ("eos token ids", ", ".join(map(str, manifest.eos_token_ids)) or "none"),
        ("tokenizer", "yes" if manifest.has_tokenizer else "no (token ids only)"),
        ("chat template", "yes" if manifest.has_chat_template else "no"),
        ("inputs", ", ".join(manifest.inputs[:6]) + (f", ... ({len(manifest.inputs)} in all)" if len(manifest.inputs) > 6 else "")),
        ("outputs", ", ".join(manifest.outputs[:3]) + (f", ... ({len(manifest.outputs)} in all)" if len(manifest.outputs) > 3 else "")),
    ]
    if manifest.quantization is not None:
        q = manifest.quantization
        rows.append(("quantization", f"int{q.bits} weights, block size {q.block_size}, accuracy level {q.accuracy_level} ({q.method})"))
    if manifest.quality is not None:
        q = manifest.quality
        rows.append(("quality vs fp32", f"top-1 agreement {q.top1_agreement:.3f} (>= {q.min_top1_agreement}), mean KL "
                                        f"{q.mean_kl:.4f} (<= {q.max_mean_kl}), greedy agreement {q.greedy_agreement:.3f} "
                                        f"(>= {q.min_greedy_agreement}); {q.description}"
                                        + ("" if q.enforced else "; gate recorded, not enforced (--quality-gate record)")))
    if manifest.parity is not None:
        p = manifest.parity
        rows.append(("parity vs PyTorch", f"max abs diff {p.max_abs_diff:.2e} (tolerance {p.tolerance:g}; {p.description})"))
    rows += [("source", manifest.source), ("exported with", ", ".join(f"{k} {v}" for k, v in manifest.versions.items()))]
    return rows
