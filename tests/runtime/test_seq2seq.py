"""Text encoder-decoders on Whisper's machinery (exporter/seq2seq.py, runtime/seq2seq.py): tiny random
Marian and BART models exported by `ortinf export` (parity recorded at export), then ragged sources
decoded together, with fewer slots than sources, through preemption and a source seen twice, greedy
token for token against transformers' own generate (num_beams=1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import ortinf
from ortinf import LLM
from ortinf.runtime.seq2seq import Seq2Seq

COMMON = dict(vocab_size=300, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64, init_std=0.3)
MODELS = {
    "marian": (transformers.MarianMTModel, lambda: transformers.MarianConfig(**COMMON, pad_token_id=299, eos_token_id=0,
                                                                              decoder_start_token_id=299)),
    "bart": (transformers.BartForConditionalGeneration, lambda: transformers.BartConfig(**COMMON)),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def seq2seq(request, tmp_path_factory):
    cls, config = MODELS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    model = cls(config()).eval()
    model.save_pretrained(root / "hf")
    manifest = ortinf.export(root / "hf", root / "pkg", progress=False)
    assert manifest.task == "text2text-generation" and manifest.parity.max_abs_diff < 1e-4
    return request.param, model, root / "pkg"


def reference(model, sources: list[list[int]], max_new_tokens: int) -> list[list[int]]:  # noqa: ANN001
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
    # output tokens (2 blocks each), so the later is preempted and readmitted from the cache
    runner = Seq2Seq(package, max_seqs=2, num_blocks=8)
    assert runner.generate_ids(sources, max_new_tokens=20) == expected
    assert runner.preemptions >= 1
    roomy = Seq2Seq(package, max_seqs=2)
    assert roomy.generate_ids(sources[:2], max_new_tokens=20) == expected[:2]
    assert roomy.generate_ids(sources[:1], max_new_tokens=20) == expected[:1]  # the same source again: no encoder call
    assert roomy.encoded_windows == 2 and roomy.blocks.cross_hits == 1
    assert all(len(tokens) >= 5 for tokens in expected)  # real decoding, not an immediate end
    if name == "bart":  # BART's random weights give each source its own output (Marian's tiny one does not)
        assert len({tuple(t) for t in expected}) == len(expected)
    with pytest.raises(ortinf.errors.RequestError, match="source"):
        runner.generate_ids([[]])
    llm = LLM(package)
    assert llm.text2text([sources[2]], max_new_tokens=20) == expected[2:3]
    with pytest.raises(ortinf.errors.RequestError, match="not both"):
        llm.text2text(["a text", sources[2]])
