"""onnxruntime-genai's Whisper for benchmarks/whisper.py, in .venv-bench-genai (benchmarks/peers/install_genai.sh).

    .venv-bench-genai/bin/python benchmarks/peers/run_genai_whisper.py JOB.json RESULT.json

JOB.json: {"hf_dir", "work_dir", "tokens", "threads", "cases": [[name, [seconds per audio]]]}. The model is
converted by genai's own builder (the job's precision, cpu) into work_dir. Each case's audios are cut into 30-second
windows that decode as one batch (genai has no continuous batching), `tokens` greedy tokens each,
features by transformers' WhisperFeatureExtractor inside the timing (ortinf's and transformers' runs
time their front ends too). RESULT.json: {"seconds": {name: s}, "tokens": first window's tokens}.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def audio(seconds: float, seed: int) -> np.ndarray:  # benchmarks/whisper.py's audio
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    return (0.3 * np.sin(2 * np.pi * (220 + 40 * seed) * t) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    work = Path(job["work_dir"])
    if not (work / "genai_config.json").is_file():
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", job["hf_dir"], "-o", str(work), "-p",
                        job.get("precision", "fp32"),
                        "-e", "cpu"], check=True, capture_output=True)
    config = json.loads((work / "genai_config.json").read_text())
    for part in ("encoder", "decoder"):
        config["model"][part]["session_options"]["intra_op_num_threads"] = job["threads"]
    (work / "genai_config.json").write_text(json.dumps(config, indent=4))

    import onnxruntime_genai as og
    import transformers

    model = og.Model(str(work))
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    start_token, tokens = job["start_token"], job["tokens"]

    def run(audios: list[np.ndarray], count: int) -> tuple[float, list[int]]:
        started = time.monotonic()
        windows = [a[s : s + 480000] for a in audios for s in range(0, len(a), 480000)]
        features = extractor(windows, sampling_rate=16000, return_tensors="np").input_features.astype(np.float32)
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=1 + count, min_length=1 + count, batch_size=len(windows))
        generator = og.Generator(model, params)
        inputs = og.NamedTensors()
        inputs["audio_features"] = features
        inputs["input_ids"] = np.full((len(windows), 1), start_token, dtype=np.int32)
        generator.set_inputs(inputs)
        while not generator.is_done():
            generator.generate_next_token()
        first = [int(t) for t in generator.get_sequence(0)[1:]]
        return time.monotonic() - started, first

    run([audio(1, 0)], 2)  # warm-up
    seconds, first = {}, None
    for name, lengths in job["cases"]:
        seconds[name], tokens_seen = run([audio(s, i) for i, s in enumerate(lengths)], tokens)
        first = first or tokens_seen
    Path(sys.argv[2]).write_text(json.dumps({"seconds": seconds, "tokens": first}))


if __name__ == "__main__":
    main()
