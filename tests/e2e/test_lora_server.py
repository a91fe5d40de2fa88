"""Multi-LoRA behind a real server: adapters in /v1/models, chosen by `model` (the official openai
client too), batched with the base model, loaded and unloaded at runtime under traffic, and the
load/unload routes absent without --allow-runtime-lora-updates."""

from __future__ import annotations

import asyncio
import copy

import httpx
import openai
import peft
import pytest
import torch
from support.server_helpers import running_server
from support.tiny_models import add_tokenizer, build_decoder

import ortinf
from ortinf import LLM, SamplingParams

PROMPT = [5, 9, 13, 21, 34, 55, 89, 144]
GREEDY = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def lora_package(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-server")
    model = build_decoder("llama", root / "hf")
    add_tokenizer(root / "hf")
    ortinf.export(root / "hf", root / "pkg", progress=False, enable_lora=True)
    for seed, (name, targets) in enumerate({"alpha": ["q_proj", "v_proj"], "beta": ["gate_proj", "up_proj", "down_proj"]}.items()):
        torch.manual_seed(seed)
        peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                                                   target_modules=targets)).save_pretrained(root / name)
    offline = LLM(root / "pkg", provider="cpu", num_blocks=64, lora_modules={"alpha": str(root / "alpha"), "beta": str(root / "beta")})
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    expected = {name: offline.generate([PROMPT], params, lora=name)[0].outputs[0].text for name in ("alpha", "beta", None)}
    assert len(set(expected.values())) == 3  # each adapter changes the output
    return root, expected


def test_adapters_are_models_and_batch_with_the_base(lora_package, tmp_path):
    root, expected = lora_package
    args = [str(root / "pkg"), "--served-model-name", "base", "--kv-cache-memory", "32MiB", "--lora-modules", f"alpha={root / 'alpha'}",
            "--max-loras", "2", "--allow-runtime-lora-updates"]
    with running_server(args, tmp_path) as server:
        cards = {m["id"]: m for m in httpx.get(f"{server.url}/v1/models").json()["data"]}
        assert set(cards) == {"base", "alpha"} and cards["alpha"]["parent"] == "base" and cards["alpha"]["root"].endswith("alpha")

        async def batch(names):
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                replies = await asyncio.gather(*(client.post("/v1/completions", json={**GREEDY, "model": n}) for n in names))
                return [r.json()["choices"][0]["text"] for r in replies]

        assert asyncio.run(batch(["alpha", "base", "alpha", "base"])) == [expected["alpha"], expected[None]] * 2
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        assert client.completions.create(model="alpha", prompt=PROMPT, max_tokens=10, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text == expected["alpha"]
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="beta", prompt=PROMPT, max_tokens=2)

        async def load_under_traffic():
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
                traffic = [asyncio.ensure_future(c.post("/v1/completions", json={**GREEDY, "model": "alpha", "max_tokens": 40}))
                           for _ in range(4)]
                loaded = await c.post("/v1/load_lora_adapter", json={"lora_name": "beta", "lora_path": str(root / "beta")})
                beta = await c.post("/v1/completions", json={**GREEDY, "model": "beta"})
                done = await asyncio.gather(*traffic)
                return loaded, beta, done

        loaded, beta, done = asyncio.run(load_under_traffic())
        assert loaded.status_code == 200 and "beta" in loaded.text
        assert beta.json()["choices"][0]["text"] == expected["beta"]
        assert all(r.status_code == 200 and r.json()["choices"][0]["text"].startswith(expected["alpha"]) for r in done)
        again = httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "gamma", "lora_path": str(root / "beta")})
        assert again.status_code == 400 and "slots are in use" in again.json()["error"]["message"]
        unloaded = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "beta"})
        assert unloaded.status_code == 200
        assert httpx.post(f"{server.url}/v1/completions", json={**GREEDY, "model": "beta"}).status_code == 404
        assert httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "beta"}).status_code == 404
        bad = httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)})
        assert bad.status_code == 400 and "not a PEFT adapter folder" in bad.json()["error"]["message"]


def test_runtime_updates_need_the_flag(lora_package, tmp_path):
    root, expected = lora_package
    with running_server([str(root / "pkg"), "--kv-cache-memory", "32MiB", "--lora-modules", f"beta={root / 'beta'}"], tmp_path) as server:
        assert httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(root / "alpha")}).status_code == 404
        reply = httpx.post(f"{server.url}/v1/completions", json={**GREEDY, "model": "beta"}, timeout=60)
        assert reply.json()["choices"][0]["text"] == expected["beta"]
