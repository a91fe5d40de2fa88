"""Whisper's log-mel front end: numpy (ortinf/tasks/speech/audio_features.py, what ortinf runs) against the same
arithmetic as an ONNX graph (STFT, power, mel MatMul, log10) on ONNX Runtime's CPU provider, both
against transformers' WhisperFeatureExtractor; time per 30-second window.

usage: .venv/bin/python benchmarks/whisper_front_end.py [--record] [--tiny]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import transformers
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_step import cpu_flags
from record import finish

from ortinf.tasks.speech.audio_features import HOP_LENGTH, N_FFT, log_mel


def onnx_front_end(filters: np.ndarray):
    """A function computing the features through an ONNX graph (the padding and clamp in numpy)."""
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
    nodes = [
        helper.make_node("Unsqueeze", ["signal", "axes_m1"], ["sig3"]),
        helper.make_node("STFT", ["sig3", "step", "window", "length"], ["spec"], onesided=1),  # [1, frames, 201, 2]
        helper.make_node("Mul", ["spec", "spec"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "axes_m1"], ["power"], keepdims=0),
        helper.make_node("MatMul", ["power", "filters"], ["mel"]),
        helper.make_node("Max", ["mel", "floor"], ["floored"]),
        helper.make_node("Log", ["floored"], ["ln"]),
        helper.make_node("Mul", ["ln", "inv_ln10"], ["log10"]),
    ]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "axes_m1"), numpy_helper.from_array(np.array(HOP_LENGTH, np.int64), "step"),
             numpy_helper.from_array(window, "window"), numpy_helper.from_array(np.array(N_FFT, np.int64), "length"),
             numpy_helper.from_array(filters, "filters"), numpy_helper.from_array(np.array(1e-10, np.float32), "floor"),
             numpy_helper.from_array(np.array(1 / np.log(10), np.float32), "inv_ln10")]
    graph = helper.make_graph(nodes, "mel", [helper.make_tensor_value_info("signal", TensorProto.FLOAT, [1, None])],
                              [helper.make_tensor_value_info("log10", TensorProto.FLOAT, None)], inits)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])

    def run(audio: np.ndarray) -> np.ndarray:
        padded = np.pad(audio.astype(np.float32), N_FFT // 2, mode="reflect")[None]
        log_spec = session.run(None, {"signal": padded})[0][0].T[:, :-1]
        return (np.maximum(log_spec, log_spec.max() - 8.0) + 4) / 4

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="2 timed calls (smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    calls = 2 if args.tiny else 20
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    filters = extractor.mel_filters.astype(np.float32)
    rng = np.random.default_rng(0)
    audio = (0.3 * np.sin(np.arange(480_000) / 7) + 0.05 * rng.standard_normal(480_000)).astype(np.float32)
    reference = extractor(audio, sampling_rate=16_000, return_tensors="np").input_features[0]
    rows = []
    for name, run in (("numpy (ortinf)", lambda a: log_mel(a, filters)), ("ONNX STFT graph, CPU provider", onnx_front_end(filters))):
        error = float(np.abs(run(audio) - reference).max())
        start = time.perf_counter()
        for _ in range(calls):
            run(audio)
        rows.append((name, (time.perf_counter() - start) / calls * 1e3, error))
    lines = [f"### Whisper front end: log-mel of one 30-second window ({time.strftime('%Y-%m-%d')})", "",
             f"CPU: {platform.machine()}, {cpu_flags()}; 80 mel bins, 2 threads; mean of {calls} calls.", "",
             "| front end | ms per window | max abs error vs WhisperFeatureExtractor |", "|---|---:|---:|"]
    lines += [f"| {name} | {ms:.1f} | {error:.1e} |" for name, ms, error in rows]
    finish(lines, args.record)


if __name__ == "__main__":
    main()
