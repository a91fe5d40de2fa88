"""The public API: `from ortinf import LLM, SamplingParams`."""

from __future__ import annotations

import numpy as np
import pytest

import ortinf
from ortinf import LLM, SamplingParams
from ortinf.errors import ConfigError, RequestError


@pytest.fixture(scope="module")
def llm(decoder_package):
    _, package = decoder_package("llama")
    return LLM(package, provider="cpu", num_blocks=256)


def test_generate_text_and_token_prompts(llm):
    outputs = llm.generate(["the quick brown fox", "a small cat"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [o.request_id for o in outputs] == ["0", "1"]
    assert [o.prompt for o in outputs] == ["the quick brown fox", "a small cat"]
    first = outputs[0]
    assert len(first.outputs[0].token_ids) == 8 and first.outputs[0].finish_reason == "length"
    again = llm.generate(first.prompt_token_ids, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert again[0].prompt is None and again[0].outputs[0].token_ids == first.outputs[0].token_ids
    assert again[0].outputs[0].text == first.outputs[0].text


def test_n_samples_with_a_seed(llm):
    params = SamplingParams(temperature=1.0, max_tokens=10, n=3, seed=7, ignore_eos=True)
    first = llm.generate("the lazy dog", params)[0]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    samples = [tuple(c.token_ids) for c in first.outputs]
    assert len(set(samples)) == 3  # each sample draws from its own seed
    second = llm.generate("the lazy dog", params)[0]
    assert [tuple(c.token_ids) for c in second.outputs] == samples


def test_per_prompt_params_and_errors(llm):
    outputs = llm.generate(["a", "b"], [SamplingParams(temperature=0, max_tokens=2), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)])
    assert len(outputs[1].outputs[0].token_ids) == 5
    with pytest.raises(RequestError, match="2 prompts"):
        llm.generate(["a", "b"], [SamplingParams()])
    with pytest.raises(RequestError, match="context length"):
        llm.generate(["a", [5] * 600], SamplingParams(max_tokens=4))
    assert not llm.engine.has_unfinished_requests()  # the valid first prompt was withdrawn too
    with pytest.raises(ConfigError, match="embed"):
        llm.embed("text")


def test_embed_with_an_encoder_package(minilm_package):
    package = minilm_package
    encoder = LLM(package, provider="cpu")
    vectors = encoder.embed(["a cat on a mat", "a kitten on a rug", "stock markets fell"])
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]  # a trained model: similar meanings lie close
    with pytest.raises(ConfigError, match="embed\\(\\)"):
        encoder.generate("hello")
    with pytest.raises(ConfigError, match="block_size: not an option of a feature-extraction model"):
        LLM(package, provider="cpu", block_size=32)  # issue 30: never silently dropped
    batched = LLM(package, provider="cpu", max_num_seqs=2, max_num_batched_tokens=64)  # an encoder step's budget (issue 44)
    np.testing.assert_allclose(batched.embed(["a cat on a mat", "a kitten on a rug", "stock markets fell"]), vectors, atol=1e-5)
    assert batched.task.engine.num_steps == 2  # 3 inputs at most 2 rows a step (the pooling task's PoolingEngine)


def test_unknown_engine_option_is_a_config_error(decoder_package):
    _, package = decoder_package("llama")
    with pytest.raises(ConfigError, match="unknown engine option"):
        LLM(package, num_blokcs=3)
    with pytest.raises(ConfigError, match="bf16_math must be bf16 or fp32, got 'fp16'"):  # before any session is made
        LLM(package, bf16_math="fp16")


def test_a_hugging_face_folder_is_exported_into_the_cache_once(decoder_package, tmp_path, monkeypatch):
    """LLM("./hf-model-dir") (and `ortinf serve ./hf-model-dir`) exports on first use and reuses it after."""
    from ortinf.runtime.sample.sampling_params import SamplingParams

    _, package = decoder_package("llama")
    hf = package.parent / "hf"
    monkeypatch.setenv("ORTINF_CACHE", str(tmp_path / "cache"))
    first = ortinf.LLM(hf)
    manifests = list((tmp_path / "cache").rglob("ortinf.json"))
    assert len(manifests) == 1 and manifests[0].parent.name == "hf"  # served as the folder's name
    stamp = manifests[0].stat().st_mtime_ns
    again = ortinf.LLM(hf)
    assert list((tmp_path / "cache").rglob("ortinf.json")) == manifests and manifests[0].stat().st_mtime_ns == stamp
    params = SamplingParams(max_tokens=8, temperature=0)
    direct = ortinf.LLM(package).generate([[5, 6, 7]], params)[0].outputs[0].token_ids
    assert first.generate([[5, 6, 7]], params)[0].outputs[0].token_ids == direct == again.generate([[5, 6, 7]], params)[0].outputs[0].token_ids
