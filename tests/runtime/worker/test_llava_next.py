"""LLaVA-NeXT (LLaVA 1.6) on the one engine (issue 33): a tiny random LlavaNextForConditionalGeneration exported by
`ortinf export`. An image is its whole plus tiles of the best grid resolution; its tokens are the whole image's,
then the tiles' grid unpadded to the image's aspect with a newline embedding after each row, so their count follows
the image's size. The tiles equal LlavaNextImageProcessor's, the prompt ids LlavaNextProcessor's, and greedy tokens
transformers' generate on ragged batches (wide, tall and square images, text-only requests), through a preempting
pool, each image encoded once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from support.tiny_models import build_llava_next

import ortinf
from ortinf import LLM, SamplingParams
from ortinf.runtime.worker.vision_families.llava_next import anyres_tiles

Image = pytest.importorskip("PIL.Image")
NEW = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    root = tmp_path_factory.mktemp("llava-next")
    model = build_llava_next(root / "hf")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(root / "hf" / "tokenizer.json"))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    processor = transformers.LlavaNextProcessor(image_processor=transformers.LlavaNextImageProcessor.from_pretrained(root / "hf"),
                                                tokenizer=tokenizer, patch_size=7, vision_feature_select_strategy="default",
                                                image_token="<image>", num_additional_image_tokens=1)
    manifest = ortinf.export(root / "hf", root / "pkg", progress=False)
    assert manifest.vision.family == "llava_next" and manifest.vision.max_abs_diff < 1e-4
    return model, processor, root / "pkg"


def picture(seed: int, shape: tuple[int, ...]):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))


def reference(model, processor, text: str, pictures: list) -> tuple[list[int], list[int]]:
    inputs = processor(text=[text], images=pictures or None, return_tensors="pt")
    inputs.pop("token_type_ids", None)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    return inputs["input_ids"][0].tolist(), out[0, inputs["input_ids"].shape[1]:].tolist()


def test_tiles_equal_llava_next_image_processor(llava_next):
    _, processor, package = llava_next
    settings = ortinf.manifest.Manifest.load(package).vision.processor
    for seed, shape in ((1, (30, 70, 3)), (2, (70, 30, 3)), (3, (50, 50, 3)), (4, (20, 33, 3)), (5, (90, 61, 4))):
        image = picture(seed, shape)
        tiles, _, size = anyres_tiles(image, settings)
        expected = processor.image_processor(image, return_tensors="np")
        assert list(size) == expected["image_sizes"][0].tolist()
        np.testing.assert_allclose(tiles, expected["pixel_values"][0][: len(tiles)], atol=1e-5)


def test_ragged_batches_equal_transformers(llava_next):
    model, processor, package = llava_next
    a, b, c = picture(1, (30, 70, 3)), picture(2, (70, 30, 3)), picture(3, (50, 50, 3))
    cases = [("the cat<image>is brown", [a]), ("a small dog", []), ("<image>and<image>watch", [b, c]), ("<image>" + " the fox" * 6, [c])]
    expected = [reference(model, processor, text, pictures) for text, pictures in cases]
    prompts = [{"prompt": text, "multi_modal_data": {"image": pictures}} if pictures else text for text, pictures in cases]
    llm = LLM(package, max_num_seqs=8)
    outputs = llm.generate(prompts, GREEDY)
    assert [o.prompt_token_ids for o in outputs] == [ids for ids, _ in expected]  # LlavaNextProcessor's token counts
    assert [o.outputs[0].token_ids for o in outputs] == [tokens for _, tokens in expected]
    assert llm.engine.runner.vision.num_encoded == 3
    tight = LLM(package, max_num_seqs=3, num_blocks=24, block_size=8, max_model_len=160, max_num_batched_tokens=16)
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, GREEDY)] == [tokens for _, tokens in expected]
    assert tight.engine.scheduler.stats.num_preemptions > 0
