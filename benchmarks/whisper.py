"""Speech recognition: ortinf's Transcriber beside transformers' Whisper generate, same model, same run.

usage: .venv/bin/python benchmarks/whisper.py [--record] [--tiny]

Model: the shape of whisper-tiny (d_model 384, 4 encoder and 4 decoder layers, 6 heads, vocabulary
51865, 80 mel bins), random weights (no checkpoint can be downloaded here), fp32, 2 threads. Each
30-second window decodes 48 tokens greedily (EOS suppressed in both engines by the generation
config's suppress_tokens, so that both do the same work). Rows: 1 and 4 concurrent audios of 30 s, and 1 of 5 min (10 windows). Real-time factor =
wall seconds / audio seconds (lower is better). transformers runs its windows as one padded batch
through `generate`; onnxruntime-genai (its own venv and model builder) as one static batch; ortinf
batches them in its paged decoder.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_step import cpu_flags
from record import finish

import ortinf
from ortinf.tasks.speech.audio_features import SAMPLE_RATE
from ortinf.tasks.speech.transcriber import Transcriber

SHAPE = dict(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
             decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_source_positions=1500,
             max_target_positions=448, pad_token_id=50257, bos_token_id=50257, eos_token_id=50257, decoder_start_token_id=50258)
TINY = dict(SHAPE, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
            encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=51865)


def audio(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * (220 + 40 * seed) * t) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


def hf_transcribe(model, extractor, audios: list[np.ndarray], tokens: int) -> float:
    windows = [a[s : s + 30 * SAMPLE_RATE] for a in audios for s in range(0, len(a), 30 * SAMPLE_RATE)]
    start = time.monotonic()
    features = torch.from_numpy(extractor(windows, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features)
    with torch.no_grad():
        model.generate(input_features=features, decoder_input_ids=torch.full((len(windows), 1), model.config.decoder_start_token_id),
                       max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    return time.monotonic() - start


def run_genai(tmp: Path, cases: list, tokens: int, start_token: int, precision: str = "fp32") -> dict | None:
    """onnxruntime-genai's Whisper on the same model (benchmarks/peers/run_genai_whisper.py, its own venv)."""
    import json
    import subprocess

    python = Path(__file__).resolve().parent.parent / ".venv-bench-genai" / "bin" / "python"
    if not python.is_file():
        print("onnxruntime-genai: not installed (bash benchmarks/peers/install_genai.sh)")
        return None
    job = {"hf_dir": str(tmp / "hf"), "work_dir": str(tmp / "genai"), "tokens": tokens, "threads": 2, "cases": cases,
           "start_token": start_token, "precision": precision}
    (tmp / "genai-job.json").write_text(json.dumps(job))
    runner = Path(__file__).resolve().parent / "peers" / "run_genai_whisper.py"
    subprocess.run([str(python), str(runner), str(tmp / "genai-job.json"), str(tmp / "genai-result.json")], check=True)
    return json.loads((tmp / "genai-result.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a 1-layer model, short runs (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    parser.add_argument("--dtype", choices=["fp32", "int8", "int4"], default="fp32",
                        help="ortinf's and onnxruntime-genai's weights (transformers stays fp32)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    shape, tokens = (TINY, 4) if args.tiny else (SHAPE, 48)
    cases = [("1 x 30 s", [30.0]), ("4 x 30 s", [30.0] * 4), ("1 x 5 min", [300.0])]
    if args.tiny:
        cases = [("1 x 30 s", [30.0]), ("2 x 30 s", [30.0] * 2)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**shape)).eval()
        model.generation_config.suppress_tokens = [shape["eos_token_id"]]  # every window decodes `tokens` tokens, in both engines
        model.generation_config.begin_suppress_tokens = None
        model.save_pretrained(Path(tmp) / "hf")
        ortinf.export(Path(tmp) / "hf", Path(tmp) / "pkg", dtype=args.dtype, progress=False)
        # no prefix caching: the cases share audio (each case's first window is audio(30, 0)), and the
        # other engines have no cache to find it in
        transcriber = Transcriber(Path(tmp) / "pkg", max_num_seqs=10, intra_op_threads=2, enable_prefix_caching=False)
        extractor = transformers.WhisperFeatureExtractor(feature_size=shape["num_mel_bins"])
        transcriber.transcribe_ids([audio(1, 0)], max_new_tokens=2)  # warm-up
        hf_transcribe(model, extractor, [audio(1, 0)], 2)
        genai = run_genai(Path(tmp), cases, tokens, shape["decoder_start_token_id"], args.dtype)
        for name, lengths in cases:
            audios = [audio(s, i) for i, s in enumerate(lengths)]
            seconds = sum(lengths)
            start = time.monotonic()
            got = transcriber.transcribe_ids(audios, max_new_tokens=tokens)
            ours = time.monotonic() - start
            theirs = hf_transcribe(model, extractor, audios, tokens)
            peer = genai["seconds"][name] / seconds if genai else None
            rows.append((name, ours / seconds, theirs / seconds, peer))
            if genai and got[0][:tokens] != genai["tokens"][:tokens]:
                print(f"note: onnxruntime-genai's first window differs from ortinf's: {genai['tokens'][:8]} vs {got[0][:8]}")
            elif genai:
                print(f"{name}: onnxruntime-genai's first window has ortinf's {tokens} tokens")
    lines = [f"### Whisper (whisper-tiny shape, random weights): real-time factor, {args.dtype} ({time.strftime('%Y-%m-%d')})", "",
             f"CPU: {platform.machine()}, {cpu_flags()}; ortinf and onnxruntime-genai {args.dtype}, transformers fp32, 2 threads; "
             f"{tokens} tokens per 30-second window; "
             "wall seconds / audio seconds, lower is better.", "",
             "| audio | ortinf | transformers generate | onnxruntime-genai | ortinf vs transformers | ortinf vs genai |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, ours, theirs, peer in rows:
        lines.append(f"| {name} | {ours:.4f} | {theirs:.4f} | {f'{peer:.4f}' if peer else 'not installed'} | {theirs / ours:.2f}x | "
                     f"{f'{peer / ours:.2f}x' if peer else '-'} |")
    finish(lines, args.record)


if __name__ == "__main__":
    main()
