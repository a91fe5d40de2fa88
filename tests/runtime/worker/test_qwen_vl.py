"""Qwen2.5-VL and Qwen2-VL on the one engine (issue 33): tiny random models exported by `ortinf export`, images at
their own resolution (different patch grids, so different token counts), M-RoPE positions, Qwen2.5-VL's windowed
vision attention. Greedy tokens equal transformers' generate on ragged batches mixing image and text-only
requests, one and two images per prompt, through a preempting pool and a conversation that re-sends its image;
the numpy preprocessing equals Qwen2VLImageProcessor; the M-RoPE positions equal get_rope_index's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from support.tiny_models import QWEN_VL_TOKENS, add_tokenizer, build_qwen_vl

import ortinf
from ortinf import LLM, SamplingParams
from ortinf.errors import RequestError
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage
from ortinf.runtime.worker.mrope import rope_deltas
from ortinf.runtime.worker.vision_families.qwen2_vl import qwen_patches

Image = pytest.importorskip("PIL.Image")
PAD, START, END = QWEN_VL_TOKENS["image_token_id"], QWEN_VL_TOKENS["vision_start_token_id"], QWEN_VL_TOKENS["vision_end_token_id"]
NEW = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen2_vl"])
def qwen(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    model = build_qwen_vl(root / "hf", request.param)
    add_tokenizer(root / "hf", 290)
    processor = transformers.Qwen2VLImageProcessor.from_pretrained(root / "hf")
    manifest = ortinf.export(root / "hf", root / "pkg", progress=False)
    assert manifest.vision.family == "qwen2_vl" and manifest.vision.max_abs_diff < 1e-4 and "rope_deltas" in manifest.inputs
    return model, processor, root / "pkg"


def images(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)  # 2x3, 2x2 and 3x2 tokens (after smart_resize to multiples of 28 px)
    return [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for shape in ((60, 80, 3), (56, 50, 3), (90, 55, 3))]


def reference(model, processor, ids: list[int], pictures: list) -> list[int]:
    extra = {}
    if pictures:
        out = processor(pictures, return_tensors="pt")
        extra = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        counts = iter((out["image_grid_thw"].prod(-1) // 4).tolist())
        ids = [t for token in ids for t in ([PAD] * next(counts) if token == PAD else [token])]
    prompt = torch.tensor([ids])  # the mask given: generate would infer one from pad_token_id, which a prompt may hold
    with torch.no_grad():
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                   pad_token_id=0, **extra)
    return generated[0, len(ids):].tolist()


def test_preprocessing_equals_qwen2_vl_image_processor(qwen):
    _, processor, package = qwen
    settings = ortinf.manifest.Manifest.load(package).vision.processor
    rng = np.random.default_rng(1)
    # a small image scaled up to min_pixels, a large one down to max_pixels, odd sizes, RGBA and greyscale
    for shape, mode in (((60, 80, 3), "RGB"), ((20, 30, 3), "RGB"), ((400, 300, 3), "RGB"), ((90, 55, 4), "RGBA"), ((70, 41), "L")):
        picture = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode)
        patches, grid = qwen_patches(picture, settings)
        out = processor(picture, return_tensors="np")
        assert [1, *grid] == out["image_grid_thw"][0].tolist()
        np.testing.assert_allclose(patches, out["pixel_values"], atol=1e-5)


def test_mrope_positions_equal_get_rope_index(qwen):
    model, _, _ = qwen
    grids = [(2, 3), (3, 2), (1, 4)]
    ids = [5, START] + [PAD] * 6 + [END, 9, 10, START] + [PAD] * 6 + [END, START] + [PAD] * 4 + [END, 11]
    thw = torch.tensor([[1, 2 * r, 2 * c] for r, c in grids])
    expected, delta = model.model.get_rope_index(torch.tensor([ids]), thw)
    offsets = [i for i in range(len(ids)) if ids[i] == PAD and ids[i - 1] == START]
    placed = [PlacedImage(o, EncoderInput.of(np.zeros(1), r * c, "image"), (r, c)) for o, (r, c) in zip(offsets, grids)]
    whole = rope_deltas(placed, 0, len(ids) + 3) + np.arange(len(ids) + 3)
    np.testing.assert_array_equal(whole[:, : len(ids)], expected[:, 0].numpy())
    np.testing.assert_array_equal(whole[:, len(ids):], np.tile(np.arange(len(ids), len(ids) + 3) + int(delta), (3, 1)))  # generated
    for start, end in ((0, 7), (7, 19), (19, 29)):  # any span, as chunked prefill asks
        np.testing.assert_array_equal(rope_deltas(placed, start, end) + np.arange(start, end), whole[:, start:end])


def test_ragged_batches_of_images_and_text_equal_transformers(qwen):
    model, processor, package = qwen
    a, b, c = images()
    strip = Image.fromarray(np.random.default_rng(9).integers(0, 256, (30, 200, 3), dtype=np.uint8))  # 1x7 tokens: windows of 8 patches
    cases = [([5, START, PAD, END, 9, 11], [a]), ([5, 8, 9, 30, 31], []), ([5, START, PAD, END, 12, START, PAD, END, 40], [b, c]),
             ([START, PAD, END, *range(20, 60)], [c]), ([3, 4], []), ([7, START, PAD, END], [strip])]
    expected = [reference(model, processor, ids, pictures) for ids, pictures in cases]
    prompts = [{"prompt_token_ids": ids, "multi_modal_data": {"image": pictures}} if pictures else ids for ids, pictures in cases]
    llm = LLM(package, max_num_seqs=8)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == expected
    # a pool that cannot hold every sequence: requests are preempted mid-prompt (chunks split images) and recomputed
    tight = LLM(package, max_num_seqs=2, num_blocks=9, block_size=8, max_model_len=72, max_num_batched_tokens=8)
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, GREEDY)] == expected
    assert tight.engine.scheduler.stats.num_preemptions > 0 and tight.engine.runner.vision.num_encoded == 4


def test_an_image_sent_again_costs_no_vision_call_and_hits_the_prefix_cache(qwen):
    model, processor, package = qwen
    a, b, _ = images(3)
    llm = LLM(package, block_size=4)
    first = [5, START, PAD, END, 9]
    reply = llm.generate({"prompt_token_ids": first, "multi_modal_data": {"image": a}}, GREEDY)[0].outputs[0].token_ids
    hits = llm.engine.kv_cache.stats.num_hits
    reply = [t if t < START else 1 for t in reply]  # a random model may answer with vision tokens: not in a real turn
    second = first + reply + [13, 14]  # the next turn: the conversation so far, the same image
    again = llm.generate({"prompt_token_ids": second, "multi_modal_data": {"image": a}}, GREEDY)[0].outputs[0].token_ids
    assert again == reference(model, processor, second, [a])
    assert llm.engine.runner.vision.num_encoded == 1
    assert llm.engine.kv_cache.stats.num_hits - hits >= 2  # the image's blocks came from the cache
    other = llm.generate({"prompt_token_ids": second, "multi_modal_data": {"image": b}}, GREEDY)[0].outputs[0].token_ids
    assert other == reference(model, processor, second, [b])  # the same tokens over another image share no block


def test_placeholder_mismatch_is_a_request_error(qwen):
    _, _, package = qwen
    llm = LLM(package)
    with pytest.raises(RequestError, match="placeholders"):
        llm.generate({"prompt_token_ids": [5, START, PAD, END, PAD], "multi_modal_data": {"image": images()[:1]}}, GREEDY)
    assert llm.generate([[5, 6, 7]], GREEDY)[0].outputs[0].token_ids  # the engine goes on
