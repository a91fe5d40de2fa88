"""transformers' generate and Optimum's ORTModelForCausalLM (job["engine"]: "transformers" or "optimum").

Batch mode is one left-padded batch through generate() (neither has continuous batching); single
mode is one prompt at a time. Greedy, no EOS: the generation config has no eos_token_id, so nothing
is suppressed or stopped and every output is the plain argmax.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from protocol import load_job, loading, one_at_a_time, write_result


class StepClock:
    """A StoppingCriteria that only records when each generation step ends."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(time.monotonic())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def generate(model, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], float, float]:
    """One left-padded batch: (tokens per prompt, first token time, last token time)."""
    from transformers import GenerationConfig, StoppingCriteriaList

    longest = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt):] = torch.tensor(prompt)
        mask[row, longest - len(prompt):] = 1
    clock = StepClock()
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, generation_config=config, stopping_criteria=StoppingCriteriaList([clock]))
    return out[:, longest:].tolist(), clock.times[0], clock.times[-1]


def load(job: dict):
    if job["engine"] == "transformers":
        import transformers

        return transformers.AutoModelForCausalLM.from_pretrained(job["hf_dir"]).eval()
    import onnxruntime as ort
    from optimum.onnxruntime import ORTModelForCausalLM

    out = Path(job["work_dir"]) / "optimum"
    if not (out / "config.json").exists():
        ORTModelForCausalLM.from_pretrained(job["hf_dir"], export=True).save_pretrained(out)
    options = ort.SessionOptions()
    options.intra_op_num_threads = job["threads"]
    return ORTModelForCausalLM.from_pretrained(out, session_options=options, provider="CPUExecutionProvider")


def main() -> None:
    job = load_job()
    torch.set_num_threads(job["threads"])
    model = loading(job, lambda: load(job))
    new = job["new_tokens"]
    generate(model, job["prompts"][:2], 4)  # warm-up
    if job["mode"] == "batch":
        start = time.monotonic()
        tokens, first, last = generate(model, job["prompts"], new)
        seconds = time.monotonic() - start
        count = len(tokens)
        write_result(job, job["engine"], tokens, seconds, [first - start] * count, [(last - first) / (new - 1)] * count)
    else:
        def one(prompt):
            tokens, first, last = generate(model, [prompt], new)
            return tokens[0], first, last
        write_result(job, job["engine"], *one_at_a_time(job, one))


if __name__ == "__main__":
    main()
