"""Exported decoder graphs against transformers, for every supported architecture (fp32, <= 1e-4).

Each scenario drives the real ONNX Runtime session through DecoderGraph with a numpy KV pool and
compares the logits of every call with transformers' logits at the same positions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ortinf.exporter.architectures import DECODERS
from ortinf.kernels import library
from ortinf.manifest import Manifest
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

TOLERANCE = 1e-4
BLOCK_SIZE = 4
NUM_BLOCKS = 96
ARCHS = sorted(DECODERS)


def reference(model, tokens: list[int]) -> np.ndarray:
    """transformers' logits at every position of `tokens` (one unpaged forward)."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].numpy()


def tokens_for(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 256, n).tolist()


class Pool:
    """Hands out shuffled, non-contiguous blocks from the graph's pool."""

    def __init__(self, seed: int) -> None:
        self.free = np.random.default_rng(seed).permutation(NUM_BLOCKS).tolist()

    def take(self, num_tokens: int) -> list[int]:
        count = -(-num_tokens // BLOCK_SIZE)
        blocks, self.free = self.free[:count], self.free[count:]
        return blocks


def run(graph: DecoderGraph, chunks: list[SequenceChunk]) -> np.ndarray:
    return graph.run(build_model_input(chunks, BLOCK_SIZE))


# Every scenario runs on both CPU graphs of the package: the portable kernel (model.onnx, what every
# other provider runs) and ortinf's CPU kernel library (model.cpu.onnx), where the library is built.


@pytest.fixture(params=[(arch, fused) for arch in ARCHS for fused in (False, True)],
                ids=[f"{arch}-{'cpu_kernel' if fused else 'portable'}" for arch in ARCHS for fused in (False, True)])
def setup(request, decoder_package):
    arch, fused = request.param
    if fused and library.load() is None:
        pytest.skip("ortinf's kernel library is not built")
    model, package = decoder_package(arch)
    graph = DecoderGraph(package, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, provider="cpu", cpu_kernel=fused)
    assert graph.kernel_description.startswith("ortinf.PagedAttention" if fused else "portable")
    return model, graph


def test_prefill(setup):
    model, graph = setup
    tokens = tokens_for(1, 40)
    logits = run(graph, [SequenceChunk(tokens, 0, Pool(1).take(40))])
    assert np.abs(logits[0] - reference(model, tokens)[-1]).max() <= TOLERANCE


def test_sixteen_decode_steps(setup):
    model, graph = setup
    tokens = tokens_for(2, 10 + 16)
    ref = reference(model, tokens)
    table = Pool(2).take(len(tokens))
    run(graph, [SequenceChunk(tokens[:10], 0, table)])
    diffs = []
    for pos in range(10, len(tokens)):
        logits = run(graph, [SequenceChunk([tokens[pos]], pos, table)])
        diffs.append(np.abs(logits[0] - ref[pos]).max())
    assert len(diffs) == 16 and max(diffs) <= TOLERANCE, diffs


def test_mixed_batch_of_three(setup):
    """One call: a prefill chunk after 8 cached tokens, a decode, and a fresh 5-token prefill."""
    model, graph = setup
    pool = Pool(3)
    x, y, z = tokens_for(31, 30), tokens_for(32, 21), tokens_for(33, 5)
    tx, ty, tz = pool.take(len(x)), pool.take(len(y)), pool.take(len(z))
    run(graph, [SequenceChunk(x[:8], 0, tx), SequenceChunk(y[:20], 0, ty)])  # earlier call fills the pool
    logits = run(graph, [SequenceChunk(x[8:], 8, tx), SequenceChunk(y[20:], 20, ty), SequenceChunk(z, 0, tz)])
    expected = [reference(model, x)[-1], reference(model, y)[-1], reference(model, z)[-1]]
    assert logits.shape == (3, 256)
    for row, ref in zip(logits, expected):
        assert np.abs(row - ref).max() <= TOLERANCE


def test_block_order_does_not_matter(setup):
    """Contiguous, reversed and shuffled block tables give the same logits as transformers."""
    model, graph = setup
    tokens = tokens_for(4, 37)
    ref = reference(model, tokens)
    count = -(-len(tokens) // BLOCK_SIZE)
    tables = [list(range(count)), list(range(NUM_BLOCKS - 1, NUM_BLOCKS - 1 - count, -1)), Pool(4).take(len(tokens))]
    for table in tables:
        run(graph, [SequenceChunk(tokens[:30], 0, table)])
        logits = run(graph, [SequenceChunk(tokens[30:], 30, table)])
        assert np.abs(logits[0] - ref[-1]).max() <= TOLERANCE, table


def test_prefix_written_by_earlier_call(setup):
    """A second sequence reuses the first one's full prefix blocks and computes only its suffix."""
    model, graph = setup
    pool = Pool(5)
    prefix = tokens_for(5, 24)  # 6 full blocks
    first, second = prefix + tokens_for(51, 6), prefix + tokens_for(52, 10)
    first_table = pool.take(len(first))
    run(graph, [SequenceChunk(first, 0, first_table)])
    second_table = first_table[:6] + pool.take(len(second) - 24)
    logits = run(graph, [SequenceChunk(second[24:], 24, second_table)])
    assert np.abs(logits[0] - reference(model, second)[-1]).max() <= TOLERANCE
    # and it decodes on from there
    more = second + [7, 8]
    second_table += pool.take(2)
    ref = reference(model, more)
    for pos in (len(second), len(second) + 1):
        logits = run(graph, [SequenceChunk([more[pos]], pos, second_table)])
        assert np.abs(logits[0] - ref[pos]).max() <= TOLERANCE


def test_manifest_records_export(setup, decoder_package):
    model, graph = setup
    manifest: Manifest = graph.manifest
    assert manifest.decoder is not None and manifest.parity is not None
    assert manifest.parity.max_abs_diff <= TOLERANCE
    assert manifest.decoder.num_layers == model.config.num_hidden_layers and manifest.decoder.kernel == "portable"
    # the pool is [kv_heads, num_blocks, block_size, head_dim]: GQA K/V are not repeated per head
    assert graph.read_pool(0).shape == (manifest.decoder.num_kv_heads, NUM_BLOCKS, BLOCK_SIZE, manifest.decoder.head_dim)
    assert manifest.eos_token_ids == (model.config.eos_token_id,)
