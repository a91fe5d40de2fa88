"""Multi-LoRA serving against transformers: PEFT adapters made here with `peft` on a tiny llama,
greedy parity per adapter against the merged model, a batch mixing three adapters and the base
model, prefix caching never shared across adapters, loading and unloading, and clear refusals."""

from __future__ import annotations

import copy

import numpy as np
import peft
import pytest
import torch
from support.engine_helpers import hf_greedy
from support.tiny_models import add_tokenizer, build_decoder

import ortinf
from ortinf import LLM, SamplingParams
from ortinf.errors import ConfigError, RequestError

ADAPTERS = {  # name -> LoraConfig: different ranks, scales and targets (rsLoRA on one)
    "qv": dict(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    "all": dict(r=4, lora_alpha=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "mlp": dict(r=16, lora_alpha=8, target_modules=["gate_proj", "down_proj"], use_rslora=True),
}
GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    model = build_decoder("llama", root / "hf")
    add_tokenizer(root / "hf")
    ortinf.export(root / "hf", root / "pkg", progress=False, enable_lora=True)
    merged = {}
    for index, (name, config) in enumerate(ADAPTERS.items()):
        torch.manual_seed(100 + index)
        adapted = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(init_lora_weights=False, **config))
        adapted.save_pretrained(root / name)
        merged[name] = adapted.merge_and_unload().eval()
    return model, root, merged


def prompts(seed: int, count: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 256, int(n)).tolist() for n in rng.integers(5, 40, count)]


def test_a_batch_mixing_three_adapters_and_the_base_model(lora_setup):
    model, root, merged = lora_setup
    llm = LLM(root / "pkg", provider="cpu", num_blocks=256, lora_modules={name: str(root / name) for name in ADAPTERS})
    batch = prompts(1, 8)
    names = ["qv", "all", "mlp", None, "all", None, "qv", "mlp"]
    outputs = llm.generate(batch, GREEDY, lora=names)
    for prompt, name, output in zip(batch, names, outputs):
        assert output.outputs[0].token_ids == hf_greedy(merged[name] if name else model, prompt, 12), name
    # an adapter really changes the output (the test would pass for a no-op otherwise)
    assert any(hf_greedy(merged[n], p, 12) != hf_greedy(model, p, 12) for p, n in zip(batch, names) if n)


def test_prefix_cache_is_never_shared_across_adapters(lora_setup):
    model, root, merged = lora_setup
    llm = LLM(root / "pkg", provider="cpu", num_blocks=256, lora_modules={name: str(root / name) for name in ADAPTERS})
    prompt = prompts(2, 1)[0] * 3  # 3 blocks and more
    stats = llm.engine.kv_cache.stats
    runs = [("qv", 0), ("all", 0), (None, 0), ("qv", 1), ("all", 1), (None, 1)]  # (adapter, hits expected?)
    for name, hit in runs:
        before = stats.num_hits
        output = llm.generate([prompt], GREEDY, lora=name)[0]
        assert (stats.num_hits > before) == bool(hit), name
        assert output.outputs[0].token_ids == hf_greedy(merged[name] if name else model, prompt, 12)


def test_loading_and_unloading_at_runtime(lora_setup):
    model, root, merged = lora_setup
    llm = LLM(root / "pkg", provider="cpu", num_blocks=256, max_loras=1, max_lora_rank=16)
    engine = llm.engine
    prompt = prompts(3, 1)[0] * 2
    with pytest.raises(RequestError, match="no LoRA adapter named 'qv'"):
        llm.generate([prompt], GREEDY, lora="qv")
    engine.add_lora("x", root / "qv")
    assert llm.generate([prompt], GREEDY, lora="x")[0].outputs[0].token_ids == hf_greedy(merged["qv"], prompt, 12)
    with pytest.raises(ConfigError, match="all 1 LoRA slots are in use"):
        engine.add_lora("y", root / "all")
    request_id = engine.add_request(prompt, GREEDY, lora_name="x")
    with pytest.raises(ConfigError, match="in use by 1 request"):
        engine.remove_lora("x")
    engine.abort(request_id)
    engine.remove_lora("x")
    # the same name, other weights: blocks cached under the old "x" must not be hit
    engine.add_lora("x", root / "all")
    before = engine.kv_cache.stats.num_hits
    assert llm.generate([prompt], GREEDY, lora="x")[0].outputs[0].token_ids == hf_greedy(merged["all"], prompt, 12)
    assert engine.kv_cache.stats.num_hits == before


def test_clear_refusals(lora_setup, decoder_package, tmp_path):
    _, root, _ = lora_setup
    _, plain = decoder_package("llama")  # exported without --enable-lora
    with pytest.raises(ConfigError, match="--enable-lora"):
        LLM(plain, provider="cpu", num_blocks=64, lora_modules={"qv": str(root / "qv")})
    with pytest.raises(ConfigError, match="rank 16, above max_lora_rank 8"):
        LLM(root / "pkg", provider="cpu", num_blocks=64, max_lora_rank=8, lora_modules={"mlp": str(root / "mlp")})
    with pytest.raises(ConfigError, match="not a PEFT adapter folder"):
        LLM(root / "pkg", provider="cpu", num_blocks=64, lora_modules={"nope": str(tmp_path)})
    other = build_decoder("llama", tmp_path / "wide", hidden_size=96)  # an adapter for another model's shapes
    peft.get_peft_model(other, peft.LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(tmp_path / "wide-lora")
    with pytest.raises(ConfigError, match="trained for another model"):
        LLM(root / "pkg", provider="cpu", num_blocks=64, lora_modules={"wide": str(tmp_path / "wide-lora")})
    with pytest.raises(ortinf.errors.ExportError, match="--enable-lora"):
        build_decoder("gpt2", tmp_path / "g2")
        ortinf.export(tmp_path / "g2", tmp_path / "g2-pkg", progress=False, enable_lora=True)


def test_an_adapter_that_would_poison_the_batch_is_refused(lora_setup, tmp_path):
    """Every token multiplies every loaded adapter's columns (by 0 when not its own): a NaN weight would
    turn the base model's tokens to NaN too (measured: greedy [0, 0, 0, 0]). Such adapters are refused,
    as are non-finite scales."""
    import json
    import shutil

    from safetensors.numpy import load_file, save_file

    _, root, _ = lora_setup
    for name, poison in (("nan", np.nan), ("huge", 1e30)):
        folder = tmp_path / name
        shutil.copytree(root / "qv", folder)
        weights = load_file(str(folder / "adapter_model.safetensors"))
        key = next(iter(weights))
        weights[key][0, 0] = poison
        save_file(weights, str(folder / "adapter_model.safetensors"))
        with pytest.raises(ConfigError, match="non-finite or huge"):
            LLM(root / "pkg", provider="cpu", num_blocks=64, lora_modules={name: str(folder)})
    folder = tmp_path / "alpha"
    shutil.copytree(root / "qv", folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": float("inf")}))
    with pytest.raises(ConfigError, match="Infinity is not JSON"):  # strict JSON since issue 30's attack (finding 2)
        LLM(root / "pkg", provider="cpu", num_blocks=64, lora_modules={"alpha": str(folder)})


def test_adapters_with_speculative_decoding(lora_setup):
    """n-gram proposals are verified with the request's own adapter: greedy output is still the merged
    model's, for adapters and the base model in one batch."""
    model, root, merged = lora_setup
    llm = LLM(root / "pkg", provider="cpu", num_blocks=256, lora_modules={name: str(root / name) for name in ADAPTERS},
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    batch = [p * 3 for p in prompts(4, 3)]  # repeated text: the n-gram lookup proposes
    names = ["all", None, "mlp"]
    outputs = llm.generate(batch, SamplingParams(temperature=0, max_tokens=16), lora=names)
    for prompt, name, output in zip(batch, names, outputs):
        assert output.outputs[0].token_ids == hf_greedy(merged[name] if name else model, prompt, 16), name
    assert llm.engine.scheduler.spec_stats.num_draft_tokens > 0


def test_malformed_adapter_folders_are_config_errors(lora_setup, tmp_path):
    """Issue 30's attack, finding 2: these folders and paths made /v1/load_lora_adapter answer 500."""
    import shutil

    from ortinf.runtime.worker.lora import LoraAdapter

    _, root, _ = lora_setup
    from ortinf.manifest import Manifest

    spec = Manifest.load(root / "pkg").decoder
    cases = {"a name over 255 bytes": tmp_path / ("x" * 300), "a home that does not exist": "~nosuchuser/x"}
    for label, config in (("a list", "[]"), ("an infinite rank", '{"r": Infinity}'), ("deep JSON", "[" * 5000),
                          ("a NaN alpha", '{"r": 4, "lora_alpha": NaN}')):
        folder = tmp_path / label.replace(" ", "-")
        shutil.copytree(root / "qv", folder)
        (folder / "adapter_config.json").write_text(config)
        cases[label] = folder
    bad_header = tmp_path / "bad-header"
    shutil.copytree(root / "qv", bad_header)
    (bad_header / "adapter_model.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{}")
    cases["a safetensors header longer than the file"] = bad_header
    for label, folder in cases.items():
        with pytest.raises(ConfigError, match="LoRA 'bad'"):
            LoraAdapter.load("bad", folder, spec)
