"""Export-time verification: the exported graph under ONNX Runtime against the PyTorch model.

Decoders: a fixed prompt is prefilled and then decoded for 8 steps, one token per call, through a
KV pool whose blocks are deliberately shuffled and non-contiguous; each call's logits are compared
with the PyTorch model's logits at the same position.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from ortinf.errors import ExportError
from ortinf.exporter.encoder import TracedEncoder, example_batch
from ortinf.exporter.moe import lower_index_ties
from ortinf.exporter.windows import VERIFY_MEMORY, Window, windows
from ortinf.manifest import MODEL_NAME, Manifest, Parity, Quality, min_block_size
from ortinf.providers.registry import AUTO_ORDER, PROVIDERS, find
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

log = logging.getLogger(__name__)

PROMPT_LEN = 37
DECODE_STEPS = 8
BLOCK_SIZE = 8
NUM_BLOCKS = 64


def reference_logits(model: PreTrainedModel, sequences: list[list[int]]) -> np.ndarray:
    """The PyTorch model's logits at every position of `sequences` (one length: no padding), in one forward
    pass: [len(sequences), length, vocab] float32.

    Verification feeds both sides the graph's own greedy tokens (teacher forcing): the logits are compared
    at identical prefixes, and the reference's greedy continuation is the graph's up to the first position
    where the reference's argmax differs, which is all greedy agreement asks. One pass over the weights
    instead of one per generated token: the streaming export's reference reads its weights from the
    checkpoint on every pass (a 1.5B model's quality check took 208 s at one pass per token)."""
    assert len({len(s) for s in sequences}) == 1, "one length: no padding in the reference"
    with torch.no_grad(), lower_index_ties():
        return model(torch.tensor(sequences), use_cache=False).logits.float().numpy()


@dataclass(slots=True)
class Verified:
    """An export's figures: model.onnx's parity, model.cpu.onnx's (when asked), the quality gate's (when asked)."""

    parity: Parity
    cpu_parity: Parity | None = None
    quality: Quality | None = None


def verify_package(model: PreTrainedModel, package: Path, tolerance: float, progress: bool = True, cpu_kernel: bool = False,
                   quality_dtype: str | None = None, budget: int = VERIFY_MEMORY) -> Verified:
    """verify_decoder of model.onnx and (`cpu_kernel`) of model.cpu.onnx, and (`quality_dtype`) verify_quality, at the
    cost of fewer sessions and PyTorch passes: per window one session per graph, the quality prompts run on the last
    graph's session (the CPU graph where there is one, as verify_quality's) and decoded together, and one reference
    pass for both graphs' parity sequences (one length) and one for the quality prompts. On the 1.5B shape the three
    checks took three sessions and three passes over the weights (27 s of a 67 s export)."""
    parts = [(window, _verify_window(window.model, window.package, tolerance, progress, cpu_kernel, quality_dtype))
             for window in windows(model, package, budget)]
    note = _windowed([window for window, _ in parts])
    found = [figures for _, figures in parts]
    worst = Verified(_worst_parity([f.parity for f in found], note))
    if cpu_kernel:
        worst.cpu_parity = _worst_parity([f.cpu_parity for f in found], note)
    if quality_dtype is not None:
        worst.quality = _worst_quality([f.quality for f in found], note)
    return worst


def _worst_parity(found: list[Parity], note: str) -> Parity:
    # NaN (a window whose logits broke) is the worst of all: max() would keep whichever came first
    worst = max(found, key=lambda parity: _nan_high(parity.max_abs_diff))
    return replace(worst, description=worst.description + note)


def _worst_quality(found: list[Quality], note: str) -> Quality:
    worst = replace(found[0], top1_agreement=-max(_nan_high(-q.top1_agreement) for q in found),
                    mean_kl=max(_nan_high(q.mean_kl) for q in found),
                    greedy_agreement=-max(_nan_high(-q.greedy_agreement) for q in found))
    return replace(worst, description=worst.description + note)


def _verify_window(model: PreTrainedModel, package: Path, tolerance: float, progress: bool, cpu_kernel: bool,
                   quality_dtype: str | None) -> Verified:
    runs, runs_quality = [], None
    kernels = [False, True] if cpu_kernel else [False]
    for kernel in kernels:
        graph, block_size = _parity_graph(package, kernel)
        runs.append(_parity_run(graph, block_size, model.config.vocab_size, progress))
        if quality_dtype is not None and kernel == kernels[-1] and graph.provider.name == "cpu":
            runs_quality = _quality_runs(graph, block_size, model.config.vocab_size)
        del graph  # the session's memory back before the next one's and the reference's
    references = reference_logits(model, [tokens for _, tokens, _ in runs])  # one length: one pass for both graphs
    parities = [_parity(rows, reference, tolerance, description) for (rows, _, description), reference in zip(runs, references)]
    verified = Verified(parities[0], parities[1] if cpu_kernel else None)
    if quality_dtype is not None:
        if runs_quality is None:  # the parity graph ran elsewhere (a GPU kernel's package): quality on the CPU, as ever
            graph = DecoderGraph(package, num_blocks=QUALITY_BLOCKS, block_size=QUALITY_BLOCK_SIZE, provider="cpu")
            runs_quality = _quality_runs(graph, QUALITY_BLOCK_SIZE, model.config.vocab_size)
            del graph
        verified.quality = _quality_figures(model, runs_quality, quality_dtype)
    return verified


def verify_decoder(model: PreTrainedModel, package: Path, tolerance: float, progress: bool = True,
                   cpu_kernel: bool = False, budget: int = VERIFY_MEMORY) -> Parity:
    """Prefill + 8 decode steps (each feeding the graph's own greedy token) through shuffled blocks; the max
    abs logit difference over all calls against the PyTorch model on the same tokens. `cpu_kernel`: verify
    model.cpu.onnx (ortinf's CPU kernel library) instead of model.onnx. A package whose layer weights exceed
    `budget` bytes is verified in windows of layers (ortinf/exporter/windows.py): the worst window's figure."""
    parts = [(window, _verify_decoder(window.model, window.package, tolerance, progress, cpu_kernel))
             for window in windows(model, package, budget)]
    return _worst_parity([parity for _, parity in parts], _windowed([window for window, _ in parts]))


def _nan_high(value: float) -> float:
    """`value`, with NaN ordered above everything: a broken window's figure becomes the worst one (inf KL, -inf agreement), so the gate fails."""
    return float("inf") if np.isnan(value) else value


def _windowed(parts: list[Window]) -> str:
    """The description's note of the windows a figure was measured in (nothing for a package verified whole)."""
    if len(parts) == 1:
        return ""
    return (f"; in {len(parts)} windows of layers ({', '.join(f'{w.first}-{w.stop - 1}' for w in parts)}; "
            "each: the embedding, those layers, the final norm and LM head), the worst window")


def _verify_decoder(model: PreTrainedModel, package: Path, tolerance: float, progress: bool, cpu_kernel: bool) -> Parity:
    graph, block_size = _parity_graph(package, cpu_kernel)
    rows, tokens, description = _parity_run(graph, block_size, model.config.vocab_size, progress)
    del graph  # the session's memory back before the reference's: the peak is the larger of the two, not their sum
    return _parity(rows, reference_logits(model, [tokens])[0], tolerance, description)


def _parity_graph(package: Path, cpu_kernel: bool) -> tuple[DecoderGraph, int]:
    provider = verification_provider(package)
    block_size = max(BLOCK_SIZE, min_block_size(Manifest.load(package).decoder.kernel))
    # fp32 arithmetic on a bf16 package's weights (the runtime's default rounds activations to bf16): parity holds the
    # graph to the reference at fp32 tolerances, so a mis-bound tensor is not hidden in bf16's rounding
    return DecoderGraph(package, num_blocks=NUM_BLOCKS, block_size=block_size, provider=provider, cpu_kernel=cpu_kernel,
                        bf16_math="fp32"), block_size


def _parity_run(graph: DecoderGraph, block_size: int, vocab: int, progress: bool) -> tuple[dict[int, np.ndarray], list[int], str]:
    """The graph's logits over a fixed random prompt and DECODE_STEPS greedy steps (position -> logits), the tokens,
    and the run in words."""
    rng = np.random.default_rng(1234)
    tokens = rng.integers(0, vocab, PROMPT_LEN).tolist()
    num_needed = -(-(PROMPT_LEN + DECODE_STEPS) // block_size)
    block_table = rng.permutation(NUM_BLOCKS)[:num_needed].tolist()  # shuffled, non-contiguous

    chunk_len = graph.max_query_len or PROMPT_LEN  # a provider limit on new tokens per call chunks the prefill
    calls = [(s, min(s + chunk_len, PROMPT_LEN)) for s in range(0, PROMPT_LEN, chunk_len)]
    calls += [(p, p + 1) for p in range(PROMPT_LEN, PROMPT_LEN + DECODE_STEPS)]
    rows: dict[int, np.ndarray] = {}  # position -> the graph's logits there
    # nested under export's bar: only on a terminal (in a log, a second bar's cursor moves print as "[A")
    for start, end in tqdm(calls, desc="verifying", disable=not progress or not sys.stderr.isatty(), leave=False, position=1):
        chunk = SequenceChunk(tokens[start:end], start, block_table)
        rows[end - 1] = graph.run(build_model_input([chunk], block_size))[0].astype(np.float32)
        if end >= PROMPT_LEN and len(tokens) < PROMPT_LEN + DECODE_STEPS:
            tokens.append(int(rows[end - 1].argmax()))  # the graph's greedy token, fed to both sides
    description = (f"prefill {PROMPT_LEN} (in chunks of {chunk_len}) + {DECODE_STEPS} decode steps, "
                   f"block_size {block_size}, shuffled blocks, on {graph.provider.name} ({graph.kernel_description})")
    return rows, tokens, description


def _parity(rows: dict[int, np.ndarray], reference: np.ndarray, tolerance: float, description: str) -> Parity:
    worst = max(float(np.abs(row - reference[position]).max()) for position, row in rows.items())
    return Parity(max_abs_diff=worst, tolerance=tolerance, description=description)


# Reduced-precision gates. Quality prompts are
# random ids, which is harsh on a random-weight model (its next-token distributions are nearly flat,
# so tiny perturbations flip argmaxes) and easy on a trained one.
QUALITY_PROMPTS, QUALITY_LEN, GREEDY_TOKENS = 4, 48, 32
# Measured (block size 32, accuracy level 0), over the 7 tiny random-weight architectures of the tests:
# int8 top-1 0.958-0.995, KL <= 0.0001, greedy 0.39-1.00; int4 top-1 0.58-0.81, KL 0.012-0.030, greedy
# 0.00-0.59. The trained demo llama: int8 0.990 / 0.0001 / 0.93, int4 0.854 / 0.026 / 0.37. The
# benchmark's 33.6M random llama (vocab 8192): int8 0.958 / 0.0000 / 0.82, int4 0.464 / 0.0098 / 0.10
# (0.495 with the LM head kept at 8 bits: not worth its cost in speed, so not done). The gates
# sit below the worst of those with a margin, and far above what a broken quantization gives (top-1
# near 1/vocab, KL of nats). int4 greedy agreement is recorded, not gated: a random-weight model's
# near-ties flip its first token under 4-bit rounding. int8 greedy agreement is not gated either: it
# depends on the CPU. ORT's int8-activation kernels (accuracy level 4) round differently with VNNI,
# and on an AVX-512 VNNI CPU phi3's tiny random model measured 0.195 where AVX2 gave >= 0.39, while
# its top-1 agreement and KL (averages over 192 positions, not the first flip of one run) stayed
# far inside their gates. Greedy agreement is a statement about trained weights: the trained demo
# llama's int8 figure is tested (tests/runtime/worker/test_quantized.py), and every export records it.
# int8 top-1 0.88 since the numpy quantizer (ortinf/exporter/quantize.py): the tiny random gpt-oss measured
# 0.896 / KL 0.0053 / greedy 0.24 with it and 0.906 / 0.0066 / 0.16 with ORT's MatMulNBitsQuantizer,
# on both of its graphs alike: the same distributions within noise (2 of 192 positions), better in KL.
THRESHOLDS = {  # (min top-1 agreement, max mean KL in nats, min greedy agreement)
    "int8": (0.88, 0.01, 0.0),
    "int4": (0.35, 0.10, 0.0),
}


def verify_quality(model: PreTrainedModel, package: Path, dtype: str, budget: int = VERIFY_MEMORY) -> Quality:
    """Top-1 agreement and mean KL of next-token distributions over 4 x 48 positions, and greedy
    agreement over 32 generated tokens, against the fp32 PyTorch model; on the CPU provider. In windows of
    layers where the package's layer weights exceed `budget` (ortinf/exporter/windows.py): each figure is its
    worst window's."""
    parts = [(window, _verify_quality(window.model, window.package, dtype)) for window in windows(model, package, budget)]
    return _worst_quality([quality for _, quality in parts], _windowed([window for window, _ in parts]))


QUALITY_BLOCKS, QUALITY_BLOCK_SIZE = 48, 8  # the prompts' blocks (when no parity session runs on the CPU)


def _verify_quality(model: PreTrainedModel, package: Path, dtype: str) -> Quality:
    graph = DecoderGraph(package, num_blocks=QUALITY_BLOCKS, block_size=QUALITY_BLOCK_SIZE, provider="cpu")
    runs = _quality_runs(graph, QUALITY_BLOCK_SIZE, model.config.vocab_size)
    del graph  # the session's memory back before the reference's (as in verify_decoder)
    return _quality_figures(model, runs, dtype)


def _quality_runs(graph: DecoderGraph, block_size: int, vocab: int) -> list[tuple[np.ndarray, list[int]]]:
    """Per prompt: the graph's logits over the prompt and its greedy tokens; the prompts decoded together, one call a
    step (the CPU graph's rows do not depend on the rows beside them: the same figures as one prompt at a time)."""
    rng = np.random.default_rng(4321)
    prompts = [rng.integers(0, vocab, QUALITY_LEN).tolist() for _ in range(QUALITY_PROMPTS)]
    per_prompt = -(-(QUALITY_LEN + GREEDY_TOKENS) // block_size)
    tables = [list(range(i * per_prompt, (i + 1) * per_prompt)) for i in range(len(prompts))]
    chunk_len = graph.max_query_len or QUALITY_LEN
    rows = [np.empty((0, vocab), np.float32)] * len(prompts)
    for start in range(0, QUALITY_LEN, chunk_len):  # the prompts' prefill, in chunks where the provider limits them
        end = min(start + chunk_len, QUALITY_LEN)
        got = graph.run(build_model_input([SequenceChunk(p[start:end], start, t) for p, t in zip(prompts, tables)], block_size,
                                          [True] * len(prompts))).astype(np.float32)
        rows = [np.concatenate([r, got[i * (end - start):(i + 1) * (end - start)]]) for i, r in enumerate(rows)]
    tokens = [[*prompt, int(r[-1].argmax())] for prompt, r in zip(prompts, rows)]
    while len(tokens[0]) < QUALITY_LEN + GREEDY_TOKENS:
        step = graph.run(build_model_input([SequenceChunk(t[-1:], len(t) - 1, table) for t, table in zip(tokens, tables)],
                                           block_size))
        for t, row in zip(tokens, step):
            t.append(int(row.argmax()))
    return list(zip(rows, tokens))


def _quality_figures(model: PreTrainedModel, runs: list[tuple[np.ndarray, list[int]]], dtype: str) -> Quality:
    """The reference on the graph's tokens, all prompts in one pass: its greedy continuation is the graph's up to the
    first position where its argmax differs (reference_logits)."""
    agree, kls, greedy = [], [], []
    references = reference_logits(model, [tokens[:-1] for _, tokens in runs])
    for (rows, tokens), reference in zip(runs, references):
        ref = torch.log_softmax(torch.from_numpy(reference[:QUALITY_LEN]), -1)
        got = torch.log_softmax(torch.from_numpy(rows), -1)
        agree += (ref.argmax(-1) == got.argmax(-1)).tolist()
        kls += (ref.exp() * (ref - got)).sum(-1).tolist()
        wanted = reference[QUALITY_LEN - 1:].argmax(-1)  # the reference's next token after each prefix of the graph's
        generated = tokens[QUALITY_LEN:]
        same = next((i for i, (a, b) in enumerate(zip(generated, wanted)) if a != b), GREEDY_TOKENS)
        greedy.append(same / GREEDY_TOKENS)
    low_top1, high_kl, low_greedy = THRESHOLDS[dtype]
    return Quality(
        top1_agreement=float(np.mean(agree)), mean_kl=float(np.mean(kls)), greedy_agreement=float(np.mean(greedy)),
        min_top1_agreement=low_top1, max_mean_kl=high_kl, min_greedy_agreement=low_greedy,
        description=f"{QUALITY_PROMPTS} random prompts of {QUALITY_LEN} tokens, {GREEDY_TOKENS} greedy tokens each, on cpu",
    )


def verification_provider(package: Path) -> str:
    """cpu for the portable kernel; for a kernel the CPU lacks, the first installed provider that runs it."""
    kernel = Manifest.load(package).decoder.kernel
    if kernel in PROVIDERS["cpu"].kernels:
        return "cpu"
    for name in AUTO_ORDER:
        if kernel in PROVIDERS[name].kernels and find(PROVIDERS[name]) is not None:
            return name
    runs = ", ".join(name for name in AUTO_ORDER if kernel in PROVIDERS[name].kernels)
    raise ExportError(f"no installed provider runs the {kernel} kernel ({runs}), so the export cannot be verified: "
                      "install one (for WebGPU: scripts/setup_webgpu.sh) or export with --kernel portable")


def verify_encoder(graph: TracedEncoder, package: Path, tolerance: float, vocab_size: int) -> Parity:
    """A padded batch through ORT and PyTorch; the max abs difference of the graph's output."""
    batch = example_batch(graph.input_names, vocab_size, batch=3, length=19)
    with torch.no_grad():
        reference = graph(*batch).float().numpy()
    session = ort.InferenceSession(str(package / MODEL_NAME), providers=["CPUExecutionProvider"])
    feeds = {name: tensor.numpy() for name, tensor in zip(graph.input_names, batch)}
    output = session.run(None, feeds)[0].astype(np.float32)
    worst = float(np.abs(output - reference).max())
    return Parity(max_abs_diff=worst, tolerance=tolerance, description="3 padded sequences of up to 19 tokens")


def gate(quality: Quality, mode: str, hint: str, extra_failures: list[str] | None = None) -> Quality:
    """Enforces the quality thresholds (ExportError naming `hint`), or records a miss with a warning."""
    failures = quality.failures() + list(extra_failures or [])
    if not failures:
        return quality
    if mode == "enforce":
        raise ExportError(f"verification failed: {'; '.join(failures)} against the fp32 model ({quality.description}); "
                          f"nothing was written. {hint}, or --quality-gate record to keep the package with its figures")
    log.warning("quality gate not met, recorded and not enforced (--quality-gate record): %s", "; ".join(failures))
    return replace(quality, enforced=False)
