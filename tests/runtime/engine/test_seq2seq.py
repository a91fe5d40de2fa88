"""Text encoder-decoders as ordinary requests of the one engine (ortinf/exporter/seq2seq.py,
ortinf/runtime/engine/llm_engine.py with ortinf/runtime/worker/encoder_input.py): tiny random
Marian, BART, T5 and mT5 models exported by `ortinf export` (parity recorded at export), then ragged sources
decoded together, with fewer slots than sources, through preemption and a source seen twice, greedy
token for token against transformers' own generate (num_beams=1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from support.fault_injection import FaultInjection

import ortinf
from ortinf import LLM
from ortinf.runtime.sample.sampling_params import SamplingParams

COMMON = dict(vocab_size=300, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64, init_std=0.3)
T5_COMMON = dict(vocab_size=300, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, n_positions=64,
                 relative_attention_num_buckets=8, relative_attention_max_distance=20, decoder_start_token_id=0, eos_token_id=1,
                 pad_token_id=0)
SEEDS = {"t5": 4}  # weights whose greedy outputs all run to 20 tokens (the preemption test needs them to grow)
MODELS = {
    "marian": (transformers.MarianMTModel, lambda: transformers.MarianConfig(**COMMON, pad_token_id=299, eos_token_id=0,
                                                                              decoder_start_token_id=299)),
    "bart": (transformers.BartForConditionalGeneration, lambda: transformers.BartConfig(**COMMON)),
    # T5 v1.0 (ReLU, tied head) and mT5 / Flan-T5's shape (gated GELU, own head): relative position bias in the
    # paged kernel (8 buckets up to distance 20, so 30+ tokens reach the far buckets)
    "t5": (transformers.T5ForConditionalGeneration, lambda: transformers.T5Config(**T5_COMMON, initializer_factor=2.0)),
    "mt5": (transformers.MT5ForConditionalGeneration,
            lambda: transformers.MT5Config(**T5_COMMON, feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def seq2seq(request, tmp_path_factory):
    cls, config = MODELS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(SEEDS.get(request.param, 0))
    model = cls(config()).eval()
    model.save_pretrained(root / "hf")
    manifest = ortinf.export(root / "hf", root / "pkg", progress=False)
    # t5's initializer_factor 2 makes its logits ~10x the others': fp32 rounding that differs by CPU (2.8e-4 on an
    # AVX-512 VNNI EPYC, whose ONNX Runtime MatMul sums in another order than AVX2's) is the export's tolerance's business
    assert manifest.task == "text2text-generation" and manifest.parity.max_abs_diff < (1e-3 if request.param == "t5" else 1e-4)
    return request.param, model, root / "pkg"


def reference(model, sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    out = []
    for source in sources:
        with torch.no_grad():
            ids = model.generate(torch.tensor([source]), max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)[0, 1:].tolist()
        out.append([t for t in ids if t not in (model.config.eos_token_id, model.config.pad_token_id)])
    return out


def test_ragged_sources_equal_transformers_generate(seq2seq):
    name, model, package = seq2seq
    rng = np.random.default_rng(0)
    sources = [rng.integers(3, 290, n).tolist() + [model.config.eos_token_id] for n in (5, 30, 12, 50)]
    expected = reference(model, sources, 20)
    # two slots for four sources, and a pool of 8 blocks (the least that holds one 64-token source and
    # 64 tokens of output): the 51-token source (4 blocks) and the 13-token one cannot both grow to 21
    # output tokens (2 blocks each), so the later is preempted and readmitted from the cache. The
    # engine is the text engine's (ortinf/runtime/engine/llm_engine.py): its options are obeyed, its invariants hold.
    tight = LLM(package, max_num_seqs=2, num_blocks=8)
    assert tight.text2text(sources, max_new_tokens=20) == expected
    assert tight.engine.scheduler.stats.num_preemptions >= 1
    tight.engine.check_invariants()
    roomy = LLM(package, max_num_seqs=2)
    assert roomy.text2text(sources[:2], max_new_tokens=20) == expected[:2]
    assert roomy.text2text(sources[:1], max_new_tokens=20) == expected[:1]  # the same source again: no encoder call
    assert roomy.engine.runner.encoder.num_encoded == 2 and roomy.engine.kv_cache.num_cross_hits == 1
    assert all(len(tokens) >= 5 for tokens in expected)  # real decoding, not an immediate end
    if name == "bart":  # BART's random weights give each source its own output (Marian's tiny one does not)
        assert len({tuple(t) for t in expected}) == len(expected)
    with pytest.raises(ortinf.errors.RequestError, match="source"):
        tight.text2text([[]])
    llm = LLM(package)
    assert llm.text2text([sources[2]], max_new_tokens=20) == expected[2:3]
    with pytest.raises(ortinf.errors.RequestError, match="not both"):
        llm.text2text(["a text", sources[2]])


def test_a_failing_source_fails_alone(seq2seq):
    """issue 30: a text2text request whose step fails fails alone (the text engine's one-by-one re-run);
    the sources decoding beside it finish with their own output, and the pool is whole."""
    _, model, package = seq2seq
    rng = np.random.default_rng(1)
    sources = [rng.integers(3, 250, n).tolist() + [model.config.eos_token_id] for n in (7, 9, 11)]
    sources[1][2] = 297  # the poisoned one
    expected = reference(model, [sources[0], sources[2]], 12)
    llm = LLM(package)
    FaultInjection(token_id=297).install(llm.engine.runner)
    ids = [llm.engine.add_request(source, SamplingParams(max_tokens=12, temperature=0.0)) for source in sources]
    finished = {}
    while llm.engine.has_unfinished_requests():
        for output in llm.engine.step():
            llm.engine.check_invariants()
            if output.finished:
                finished[output.request_id] = output
    assert finished[ids[1]].error is not None and "injected" in str(finished[ids[1]].error)
    eos = model.config.eos_token_id
    got = [[t for t in finished[i].outputs[0].token_ids if t != eos] for i in (ids[0], ids[2])]
    assert got == expected and finished[ids[0]].error is None
    assert llm.engine.kv_cache.usage() == 0.0


@pytest.mark.parametrize(("k", "n", "max_new_tokens"), [(4, 2, 10), (3, 3, 20)])
def test_beam_search_equals_transformers(seq2seq, k, n, max_new_tokens):
    """Beams over the encoder-decoder path (the source encoded once per search: its cross blocks are
    found by digest at every step), transformers' rules included: a forced EOS scores 0."""
    name, model, package = seq2seq
    rng = np.random.default_rng(1)
    sources = [rng.integers(3, 290, m).tolist() + [model.config.eos_token_id] for m in (5, 30, 12)]
    llm = LLM(package, max_num_seqs=3)
    outputs = llm.generate(sources, SamplingParams(num_beams=k, n=n, max_tokens=max_new_tokens))
    eos = model.config.eos_token_id
    for source, output in zip(sources, outputs):
        with torch.no_grad():
            rows = model.generate(torch.tensor([source]), num_beams=k, num_return_sequences=n, max_new_tokens=max_new_tokens,
                                  do_sample=False)[:, 1:].tolist()
        expected = [row[: row.index(eos) + 1] if eos in row else row for row in rows]
        assert [c.token_ids for c in output.outputs] == expected
    assert llm.engine.kv_cache.num_cross_hits > 0  # later steps found the encoder's output
