"""Mixture-of-experts export (ortinf/exporter/moe.py): routing against transformers with ties in the top-k and
with experts that no token chose, and each expert computed on its own tokens only (no dense compute)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from support.tiny_models import add_tokenizer, build_decoder

import ortinf
from ortinf.exporter.moe import lower_index_ties
from ortinf.manifest import CPU_MODEL_NAME, MODEL_NAME
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

MOE = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss"]
TOLERANCE = 1e-4


def moe_block(layer: torch.nn.Module) -> torch.nn.Module:
    return getattr(layer, "block_sparse_moe", None) or layer.mlp  # Mixtral's name, the others'


def router(layer: torch.nn.Module) -> torch.nn.Module:
    block = moe_block(layer)
    return getattr(block, "gate", None) or block.router  # gpt-oss: a router module with weight and bias


def export(model_type: str, root, tie: bool = False):
    model = build_decoder(model_type, root / "hf")
    if tie:  # layer 0 routes every token to tied experts: all router rows equal except experts 5 and 6, equal to each other
        gate, bias = router(model.model.layers[0]).weight, getattr(router(model.model.layers[0]), "bias", None)
        with torch.no_grad():
            if bias is not None:  # gpt-oss's router has one
                bias.zero_()
            gate[:] = 0.0
            gate[5] = gate[6] = torch.linspace(-1, 1, gate.shape[1])
        model.save_pretrained(root / "hf")
    add_tokenizer(root / "hf")
    ortinf.export(root / "hf", root / "pkg", progress=False)
    return model, root / "pkg"


def logits(graph: DecoderGraph, chunks: list[SequenceChunk]) -> np.ndarray:
    return graph.run(build_model_input(chunks, 4))


def reference(model, tokens: list[int]) -> np.ndarray:
    """transformers' logits, with top-k ties to the lower expert index (ONNX TopK's rule)."""
    with torch.no_grad(), lower_index_ties():
        return model(torch.tensor([tokens])).logits[0].numpy()


def experts_chosen(model, tokens: list[int]) -> list[set[int]]:
    """The experts transformers routes each layer's tokens to."""
    chosen = []
    def record(module, inputs, out):
        ids = out[1] if isinstance(out, tuple) else torch.topk(out, 2, -1).indices  # gpt-oss's router returns its choice
        chosen.append(set(ids.flatten().tolist()))

    hooks = [router(layer).register_forward_hook(record) for layer in model.model.layers]
    reference(model, tokens)
    for hook in hooks:
        hook.remove()
    return chosen


@pytest.mark.parametrize("model_type", MOE)
@pytest.mark.parametrize("tie", [False, True], ids=["routed", "tied"])
def test_routing_matches_transformers(model_type, tie, tmp_path):
    model, package = export(model_type, tmp_path, tie)
    for fused in (False, True):
        graph = DecoderGraph(package, num_blocks=64, block_size=4, provider="cpu", cpu_kernel=fused)
        for seed, length in ((1, 1), (2, 3), (3, 37)):
            tokens = np.random.default_rng(seed).integers(3, 256, length).tolist()
            out = logits(graph, [SequenceChunk(tokens, 0, list(range(seed * 12, seed * 12 + 10)))])
            assert np.abs(out[0] - reference(model, tokens)[-1]).max() <= TOLERANCE, (fused, length)


@pytest.mark.parametrize("model_type", MOE)
def test_a_decode_step_leaves_most_experts_without_a_token(model_type, tmp_path):
    """One token picks 2 of 8 experts per layer: the other 6 run on zero rows, and the logits still match."""
    model, package = export(model_type, tmp_path)
    graph = DecoderGraph(package, num_blocks=64, block_size=4, provider="cpu")
    tokens = np.random.default_rng(9).integers(3, 256, 12).tolist()
    logits(graph, [SequenceChunk(tokens[:11], 0, [0, 1, 2])])
    step = logits(graph, [SequenceChunk(tokens[11:], 11, [0, 1, 2])])
    assert np.abs(step[0] - reference(model, tokens)[-1]).max() <= TOLERANCE
    assert all(len(chosen) == 2 for chosen in experts_chosen(model, tokens[-1:]))


@pytest.mark.parametrize("model_type", MOE)
def test_each_expert_runs_on_its_routed_tokens_only(model_type, tmp_path):
    """No dense all-experts compute: every expert's input is the rows a NonZero over the top-k ids picked."""
    model, package = export(model_type, tmp_path)
    graph = onnx.load(str(package / MODEL_NAME), load_external_data=False).graph
    config = model.config
    num_experts = getattr(config, "num_experts", None) or config.num_local_experts
    assert sum(n.op_type == "NonZero" for n in graph.node) == num_experts * config.num_hidden_layers
    assert sum(n.op_type == "ScatterND" for n in graph.node) >= num_experts * config.num_hidden_layers
    if (package / CPU_MODEL_NAME).exists():  # the CPU kernel library's graph: one ortinf.MoE node per block instead
        cpu = onnx.load(str(package / CPU_MODEL_NAME), load_external_data=False).graph
        assert sum(n.op_type == "MoE" and n.domain == "ortinf" for n in cpu.node) == config.num_hidden_layers
        assert not any(n.op_type == "NonZero" for n in cpu.node)
