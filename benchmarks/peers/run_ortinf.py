"""ortinf's engine (LLM.generate, continuous batching over the paged pool), as compare.py times it.

precision fp32 / int8 / int4 is `ortinf export --dtype`; the package is exported once into work_dir.
"""

from __future__ import annotations

import time
from pathlib import Path

from protocol import conversion, load_job, loading, write_result

import ortinf
from ortinf import LLM, SamplingParams


def main() -> None:
    job = load_job()
    export = job.get("export", {})  # e.g. accuracy_level
    package = Path(job["work_dir"]) / "-".join(["pkg", job["precision"], *(f"{k}{v}" for k, v in sorted(export.items()))])
    from ortinf.manifest import Manifest

    # (re-)export when missing, or written before this ortinf carried the CPU kernel graph
    stale = not (package / "ortinf.json").exists() or Manifest.load(package).cpu_kernel is None
    # random-weight benchmark models: the int8/int4 quality gates are recorded, not enforced (their flat
    # next-token distributions flip argmaxes under any rounding; the figures stay in the manifest)
    gate = {"quality_gate": "record"} if job["precision"] in ("int8", "int4") else {}
    job["conversion_seconds"] = conversion(
        package.with_name(package.name + ".conversion_seconds"), stale,
        lambda: ortinf.export(job["hf_dir"], package, dtype=job["precision"], progress=False, overwrite=True, **gate, **export), job)
    # what `ortinf export` ships: the packed-weight store beside the weights is a cache, not part of it
    job["package_bytes"] = sum(f.stat().st_size for f in package.iterdir() if f.is_file() and f.suffix != ".packed")
    llm = loading(job, lambda: LLM(package, provider="cpu", intra_op_threads=job["threads"], max_num_seqs=64, enable_prefix_caching=False,
                                   **job.get("options", {})))
    new = job["new_tokens"]
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    llm.generate(job["prompts"][:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    if job["mode"] == "single" and job.get("long_prompt"):  # the 512-token prompt's first-token time, on its own
        long = llm.generate([job["long_prompt"]], params)[0]
        job["ttft_long"] = long.metrics.first_token_time - long.metrics.arrival_time
    groups = [job["prompts"]] if job["mode"] == "batch" else [[p] for p in job["prompts"]]
    outputs = []
    start = time.monotonic()
    for group in groups:
        outputs += llm.generate(group, params)
    seconds = time.monotonic() - start
    write_result(job, "ortinf", [list(o.outputs[0].token_ids) for o in outputs], seconds,
                 [o.metrics.first_token_time - o.metrics.arrival_time for o in outputs],
                 [(o.metrics.finished_time - o.metrics.first_token_time) / (new - 1) for o in outputs],
                 version=ortinf.__version__)


if __name__ == "__main__":
    main()
