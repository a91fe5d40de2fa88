"""onnxruntime-genai: its model builder's export (fp32, int8 or int4 MatMulNBits, CPU target, the
builder's defaults: accuracy_level 4 for int4/int8 on CPU, block size 32) and its Generator over one
right-padded batch (GenAI has no continuous batching; a batch is decoded together to its end; it
reads the pad token id as padding, and its greedy tokens equal the unpadded ones only with the
padding on the right: left padding changed them).

Greedy without EOS stop: min_length = max_length keeps every sequence going (GenAI masks the EOS
token until then, as transformers' min_new_tokens would; the agreement column shows whether that
ever changed a token).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from protocol import conversion, load_job, loading, one_at_a_time, write_result


def model_dir(job: dict) -> Path:
    out = Path(job["work_dir"]) / job["precision"]
    job["conversion_seconds"] = conversion(
        out.with_name(out.name + ".conversion_seconds"), not (out / "genai_config.json").exists(),
        lambda: subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", job["hf_dir"], "-o", str(out),
                                "-p", job["precision"], "-e", "cpu", "-c", str(Path(job["work_dir"]) / "cache")], check=True,
                               stdout=subprocess.DEVNULL), job)
    config_file = out / "genai_config.json"
    config = json.loads(config_file.read_text())
    config["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = job["threads"]
    config["model"]["decoder"]["session_options"]["inter_op_num_threads"] = 1
    config["model"]["pad_token_id"] = 0
    config_file.write_text(json.dumps(config, indent=1))
    return out


def generate(og, model, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], float, float]:
    longest = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), longest), dtype=np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=longest + new_tokens, min_length=longest + new_tokens, do_sample=False,
                              batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(ids)  # runs the prompt
    out: list[list[int]] = [[] for _ in prompts]
    first = 0.0
    while not generator.is_done():
        generator.generate_next_token()
        for row, token in enumerate(generator.get_next_tokens()):
            out[row].append(int(token))
        first = first or time.monotonic()
    return [o[:new_tokens] for o in out], first, time.monotonic()


def main() -> None:
    import onnxruntime_genai as og

    job = load_job()
    path = model_dir(job)
    model = loading(job, lambda: og.Model(str(path)))
    new = job["new_tokens"]
    generate(og, model, job["prompts"][:2], 4)  # warm-up
    if job["mode"] == "batch":
        start = time.monotonic()
        tokens, first, last = generate(og, model, job["prompts"], new)
        seconds = time.monotonic() - start
        count = len(tokens)
        write_result(job, "onnxruntime-genai", tokens, seconds, [first - start] * count, [(last - first) / (new - 1)] * count,
                     version=og.__version__)
    else:
        def one(prompt):
            tokens, first, last = generate(og, model, [prompt], new)
            return tokens[0], first, last
        write_result(job, "onnxruntime-genai", *one_at_a_time(job, one), version=og.__version__)


if __name__ == "__main__":
    main()
