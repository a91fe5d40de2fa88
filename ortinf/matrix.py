"""`ortinf matrix`: every installed provider x every given package, measured the same way.

For each (provider, package) pair one child process (`python -m ortinf.matrix row ...`)
loads the package on the provider and measures:

- quality against the reference (the fp32 package on the CPU provider, measured first): the max abs
  difference of the prompt logits, top-1 agreement and mean KL of the next-token distributions over
  PROMPTS x PROMPT_LEN positions, and greedy agreement (share of GREEDY_TOKENS generated tokens
  before the first difference, averaged over the prompts);
- speed through the engine: decode tokens/s and TTFT at concurrency 1 (one request of NEW_TOKENS)
  and at concurrency 32 (32 requests at once; output tokens / wall time, mean TTFT);
- peak RSS of the child (wait4; every row's KV pool is POOL, so the figures compare), and the KV
  pool's size for device providers (ORT reports no device memory in use, so that is what is known).

Rows run in the environments given by --python (default: this one), so one call can cover
environments with different onnxruntime wheels (onnxruntime-openvino replaces the stock one). Each
row is a fresh process: one row's crash or memory never reaches another. Results merge into a CSV
(key: provider, package) and a section of RESULTS.md between markers; providers that no given
environment runs are listed as not measured.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

PROMPTS, PROMPT_LEN, GREEDY_TOKENS = 4, 48, 32
NEW_TOKENS, CONCURRENCY = 64, 32
POOL = "512MiB"  # the KV pool of every row: device pools need a size given, and one size makes RSS comparable
BEGIN, END = "<!-- ortinf matrix: begin -->", "<!-- ortinf matrix: end -->"
NOT_MEASURED = "not measured"


@dataclass
class Row:
    provider: str
    package: str
    dtype: str
    status: str  # "measured", or why not
    max_abs_diff: float | None = None
    top1_agreement: float | None = None
    mean_kl: float | None = None
    greedy_agreement: float | None = None
    tok_s_1: float | None = None
    ttft_ms_1: float | None = None
    tok_s_32: float | None = None
    ttft_ms_32: float | None = None
    peak_rss_mib: float | None = None
    device_pool_mib: float | None = None
    machine: str = ""
    date: str = ""


def machine() -> str:
    """'x86_64, 2 cores, AMD EPYC, CPU flags avx avx2' (the flags decide ORT's CPU kernels)."""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), platform.processor())
    flags = sorted({f for f in text.split() if f.startswith(("avx", "amx"))})
    return f"{platform.machine()}, {os.cpu_count()} cores, {model}, CPU flags {' '.join(flags) or '-'}"


# ---------------------------------------------------------------- the child: one row


def prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(2024)
    return [rng.integers(3, vocab, PROMPT_LEN).tolist() for _ in range(PROMPTS)]


def measure_row(package: Path, provider: str, threads: int, reference: Path | None, out: Path) -> None:
    """Measures one (package, provider) pair; writes its logits and greedy tokens next to `out`."""
    from ortinf.config import parse_size
    from ortinf.llm import LLM
    from ortinf.manifest import Manifest
    from ortinf.providers.base import DEVICE
    from ortinf.providers.registry import PROVIDERS
    from ortinf.runtime.sample.sampling_params import SamplingParams
    from ortinf.runtime.worker.decoder_graph import DecoderGraph
    from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

    manifest = Manifest.load(package)
    vocab = manifest.decoder.vocab_size
    on_device = PROVIDERS[provider].memory == DEVICE
    pool = {"kv_cache_memory": parse_size(POOL)}
    result: dict[str, object] = {"device_pool_mib": parse_size(POOL) / 2**20 if on_device else None}
    prompt_set = prompts(vocab)

    graph = DecoderGraph(package, num_blocks=64, block_size=16, provider=provider, intra_op_threads=threads)
    table = list(range(-(-PROMPT_LEN // 16)))
    logits = np.stack([graph.run(build_model_input([SequenceChunk(p, 0, table)], 16, [True])).astype(np.float32) for p in prompt_set])
    del graph
    llm = LLM(package, provider=provider, intra_op_threads=threads, enable_prefix_caching=False, **pool)
    greedy = SamplingParams(temperature=0, max_tokens=GREEDY_TOKENS, ignore_eos=True)
    tokens = [list(o.outputs[0].token_ids) for o in llm.generate(prompt_set, greedy)]
    np.save(out.with_suffix(".logits.npy"), logits)
    out.with_suffix(".tokens.json").write_text(json.dumps(tokens))
    if reference is not None:
        ref_logits = np.load(reference.with_suffix(".logits.npy"))
        ref_tokens = json.loads(reference.with_suffix(".tokens.json").read_text())
        result.update(_quality(ref_logits, logits, ref_tokens, tokens))

    timed = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    rng = np.random.default_rng(7)
    batch = [rng.integers(3, vocab, PROMPT_LEN).tolist() for _ in range(CONCURRENCY)]
    llm.generate(batch[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    for label, group in (("1", batch[:1]), ("32", batch)):
        start = time.monotonic()
        outputs = llm.generate(group, timed)
        wall = time.monotonic() - start
        count = sum(len(o.outputs[0].token_ids) for o in outputs)
        result[f"tok_s_{label}"] = count / wall
        result[f"ttft_ms_{label}"] = 1e3 * float(np.mean([o.metrics.first_token_time - o.metrics.arrival_time for o in outputs]))
    out.write_text(json.dumps(result))


def _quality(ref_logits: np.ndarray, logits: np.ndarray, ref_tokens: list[list[int]], tokens: list[list[int]]) -> dict[str, float]:
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    ref, got = log_softmax(ref_logits.astype(np.float64)), log_softmax(logits.astype(np.float64))
    same = [next((i for i, (a, b) in enumerate(zip(t, r)) if a != b), len(r)) / len(r) for t, r in zip(tokens, ref_tokens)]
    return {
        "max_abs_diff": float(np.abs(ref_logits - logits).max()),
        "top1_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean()),
        "mean_kl": float((np.exp(ref) * (ref - got)).sum(-1).mean()),
        "greedy_agreement": float(np.mean(same)),
    }


# ---------------------------------------------------------------- the parent: the matrix


def child_env() -> dict[str, str]:
    """The children's environment: WebGPU may use a software adapter (lavapipe where there is no GPU;
    its rows say so by their speed), as the tests do."""
    return {**os.environ, "ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER": os.environ.get("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER", "1")}


def providers_in(python: str) -> list[str]:
    """The providers an environment runs (asked in a child, since its onnxruntime may differ)."""
    proc = subprocess.run([python, "-m", "ortinf.matrix", "providers"], capture_output=True, text=True, timeout=300,
                          env=child_env())
    if proc.returncode != 0:
        raise RuntimeError(f"{python} cannot run ortinf: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_row(python: str, package: Path, provider: str, threads: int, reference: Path | None, work: Path) -> tuple[dict | None, str, float]:
    """(measurements, error, peak RSS MiB) of one child."""
    out = work / f"{provider}-{package.name}.json"
    cmd = [python, "-m", "ortinf.matrix", "row", str(package), provider, str(threads), str(out), str(reference or "")]
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=child_env())
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    rss = usage.ru_maxrss / 1024
    if proc.returncode != 0 or not out.exists():
        return None, (stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:200], rss
    return json.loads(out.read_text()), "", rss


def run_matrix(packages: list[Path], pythons: list[str], output: Path, threads: int, progress=print,
               only: list[str] | None = None) -> list[Row]:
    from ortinf.manifest import Manifest
    from ortinf.providers.registry import PROVIDERS

    dtypes = {p: Manifest.load(p).dtype for p in packages}
    fp32 = [p for p in packages if dtypes[p] == "fp32"]
    stamp, where = time.strftime("%Y-%m-%d"), machine()
    installed = {python: providers_in(python) for python in pythons}
    by_env = {python: [p for p in names if only is None or p in only] for python, names in installed.items()}
    # the reference is the fp32 package on the CPU, whichever providers are measured
    cpu_python = next((py for py, names in installed.items() if "cpu" in names), None)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        reference = None
        if fp32 and cpu_python:
            # a run of its own: the cpu x fp32 row is then measured against it like every other row,
            # so its quality columns show the CPU's run-to-run determinism instead of a self-comparison
            progress(f"reference: {fp32[0]} on cpu ({cpu_python})")
            (work / "reference").mkdir()
            data, error, _ = run_row(cpu_python, fp32[0], "cpu", threads, None, work / "reference")
            if data is None:
                raise RuntimeError(f"the reference run failed: {error}")
            reference = work / "reference" / f"cpu-{fp32[0].name}.json"
        seen = set()
        for python, names in by_env.items():
            for provider in names:
                if provider in seen:
                    continue
                seen.add(provider)
                for package in packages:
                    progress(f"{provider} x {package} ({python})")
                    data, error, rss = run_row(python, package, provider, threads, reference, work)
                    row = Row(provider, package.name, dtypes[package], "measured" if data else f"failed: {error}",
                              peak_rss_mib=rss if data else None, machine=where, date=stamp)
                    for key, value in (data or {}).items():
                        setattr(row, key, value)
                    rows.append(row)
        for name in PROVIDERS:
            if name not in seen and (only is None or name in only):
                rows += [Row(name, p.name, dtypes[p], f"{NOT_MEASURED} (not installed here)", machine=where, date=stamp) for p in packages]
    write(rows, output)
    return rows


def write(rows: list[Row], output: Path) -> None:
    """Merges rows into output/matrix.csv and rewrites the matrix section of output/RESULTS.md from
    it: a row replaces the one of the same provider and package, except that a "not measured"
    placeholder never replaces a row with figures (measured in another environment or run)."""
    output.mkdir(parents=True, exist_ok=True)
    path = output / "matrix.csv"
    names = [f.name for f in fields(Row)]
    table: dict[tuple[str, str], dict] = {}
    if path.exists():
        with path.open(newline="") as fh:
            table = {(r["provider"], r["package"]): r for r in csv.DictReader(fh)}
    for row in rows:
        key = (row.provider, row.package)
        if row.status.startswith(NOT_MEASURED) and key in table and not table[key]["status"].startswith(NOT_MEASURED):
            continue
        table[key] = asdict(row)
    merged = list(table.values())
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=names)
        writer.writeheader()
        writer.writerows(merged)
    section = "\n".join([BEGIN, *markdown(merged), END])
    results = output / "RESULTS.md"
    text = results.read_text() if results.exists() else "# Hardware matrix\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    results.write_text(text)


def markdown(rows: list[dict]) -> list[str]:
    def num(value: object, spec: str) -> str:
        return "" if value in (None, "") else format(float(value), spec)

    machines = sorted({r["machine"] for r in rows if r["machine"]})
    lines = ["### `ortinf matrix`: provider x package", "",
             f"Quality against the fp32 package on the CPU provider ({PROMPTS} random prompts of {PROMPT_LEN} tokens; greedy over "
             f"{GREEDY_TOKENS} tokens); speed through the engine ({NEW_TOKENS} new tokens per request; concurrency 1 and "
             f"{CONCURRENCY}); peak RSS of the measuring process, KV pool {POOL} in every row. Machine(s): {'; '.join(machines)}.", "",
             "| provider | package | dtype | status | max abs diff | top-1 | mean KL | greedy | tok/s @1 | TTFT ms @1 | "
             "tok/s @32 | TTFT ms @32 | peak RSS MiB | device pool MiB | date |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['provider']} | {r['package']} | {r['dtype']} | {r['status']} | {num(r['max_abs_diff'], '.2e')} | "
                     f"{num(r['top1_agreement'], '.3f')} | {num(r['mean_kl'], '.4f')} | {num(r['greedy_agreement'], '.2f')} | "
                     f"{num(r['tok_s_1'], ',.0f')} | {num(r['ttft_ms_1'], ',.0f')} | {num(r['tok_s_32'], ',.0f')} | "
                     f"{num(r['ttft_ms_32'], ',.0f')} | {num(r['peak_rss_mib'], ',.0f')} | {num(r['device_pool_mib'], ',.0f')} | {r['date']} |")
    return lines


def main() -> None:
    command = sys.argv[1]
    if command == "providers":
        from ortinf.providers.registry import available

        print(json.dumps([found.provider.name for found in available()]))
    elif command == "row":
        package, provider, threads, out, reference = sys.argv[2:7]
        measure_row(Path(package), provider, int(threads), Path(reference) if reference else None, Path(out))


if __name__ == "__main__":
    main()
