"""OpenVINO GenAI's ContinuousBatchingPipeline (paged attention on the CPU plugin, its own scheduler).

Conversion: optimum-intel's export to OpenVINO IR (`optimum-cli export openvino`), with
--weight-format fp32 / int8 / int4 (int4: symmetric, group size 32, all layers, so it is compared
like for like with the other int4 rows; int8: per-channel asymmetric, optimum-intel's default).
The fp32 row runs with INFERENCE_PRECISION_HINT f32 and KV_CACHE_PRECISION f32 (the plugin's defaults
compress the KV cache to 8 bits, and use bf16 on CPUs with AVX-512 bf16 or AMX); the "default" row
runs the same fp32 IR with the plugin's defaults, as a user gets it; the int8/int4 rows keep the
defaults too. Prefix caching off. Requests go in through add_request and the runner steps
the pipeline itself, so each request's first-token time is seen.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from protocol import conversion, load_job, loading, one_at_a_time, write_result

WEIGHT_FORMATS = {"fp32": ["--weight-format", "fp32"], "bf16": ["--weight-format", "fp16"], "int8": ["--weight-format", "int8"],
                  "int4": ["--weight-format", "int4", "--sym", "--group-size", "32", "--ratio", "1.0"]}


def model_dir(job: dict) -> Path:
    weights = "fp32" if job["precision"] == "default" else job["precision"]
    out = Path(job["work_dir"]) / weights
    job["conversion_seconds"] = conversion(
        out.with_name(out.name + ".conversion_seconds"), not (out / "openvino_model.xml").exists(),
        lambda: subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "openvino", "--model", job["hf_dir"],
                                "--task", "text-generation-with-past", *WEIGHT_FORMATS[weights], str(out)], check=True,
                               stdout=subprocess.DEVNULL), job)
    return out


class Runner:
    def __init__(self, ov_genai, path: Path, job: dict) -> None:
        import openvino as ov

        self.ov, self.ov_genai = ov, ov_genai
        scheduler = ov_genai.SchedulerConfig()
        scheduler.cache_size = 2  # GB of KV cache
        scheduler.enable_prefix_caching = False
        scheduler.max_num_seqs = 64
        scheduler.max_num_batched_tokens = 2048
        properties = {"INFERENCE_NUM_THREADS": job["threads"]}
        if job["precision"] == "fp32":
            properties.update(INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")
        self.pipe = ov_genai.ContinuousBatchingPipeline(str(path), scheduler, "CPU", properties)
        self.next_id = 0

    def generate(self, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], list[float], list[float]]:
        import numpy as np

        config = self.ov_genai.GenerationConfig()
        config.max_new_tokens = new_tokens
        config.ignore_eos = True
        config.do_sample = False
        handles = []
        for prompt in prompts:
            tensor = self.ov.Tensor(np.array([prompt], dtype=np.int64))
            handles.append(self.pipe.add_request(self.next_id, tensor, config))
            self.next_id += 1
        out: list[list[int]] = [[] for _ in prompts]
        first, last = [0.0] * len(prompts), [0.0] * len(prompts)
        while self.pipe.has_non_finished_requests():
            self.pipe.step()
            now = time.monotonic()
            for i, handle in enumerate(handles):
                if handle.can_read():
                    for output in handle.read().values():
                        out[i] += list(output.generated_ids)
                    first[i] = first[i] or now
                    last[i] = now
        return out, first, last


def main() -> None:
    import openvino_genai as ov_genai

    job = load_job()
    path = model_dir(job)
    runner = loading(job, lambda: Runner(ov_genai, path, job))
    new = job["new_tokens"]
    runner.generate(job["prompts"][:2], 4)  # warm-up
    if job["mode"] == "batch":
        start = time.monotonic()
        tokens, first, last = runner.generate(job["prompts"], new)
        seconds = time.monotonic() - start
        write_result(job, "openvino-genai", tokens, seconds, [f - start for f in first],
                     [(b - a) / (new - 1) for a, b in zip(first, last)], version=ov_genai.__version__)
    else:
        def one(prompt):
            tokens, first, last = runner.generate([prompt], new)
            return tokens[0], first[0], last[0]
        write_result(job, "openvino-genai", *one_at_a_time(job, one), version=ov_genai.__version__)


if __name__ == "__main__":
    main()
