"""Idefics3 / SmolVLM on the one engine (issue 33): a tiny random Idefics3ForConditionalGeneration exported by
`ortinf export`. An image is cut into tiles plus the whole image, and written into the prompt as text tokens around
each tile's image tokens; the prompt ids equal Idefics3Processor's, the tiles equal Idefics3ImageProcessor's, and
greedy tokens equal transformers' generate on ragged batches (unsplit and 2x2-tile images, text-only requests),
through a preempting pool, with each image encoded once; and with splitting off (one tile an image)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from support.tiny_models import build_idefics3

import ortinf
from ortinf import LLM, SamplingParams
from ortinf.errors import RequestError
from ortinf.runtime.worker.vision_families.idefics3 import idefics_tiles

Image = pytest.importorskip("PIL.Image")
NEW = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)


@pytest.fixture(scope="module", params=["idefics3", "smolvlm"])
def idefics(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    model = build_idefics3(root / "hf", family=request.param)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(root / "hf" / "tokenizer.json"))
    processor = transformers.Idefics3Processor(image_processor=transformers.Idefics3ImageProcessor.from_pretrained(root / "hf"),
                                               tokenizer=tokenizer, image_seq_len=4)  # SmolVLM's processor writes the same prompt
    manifest = ortinf.export(root / "hf", root / "pkg", progress=False)
    assert manifest.vision.family == "idefics3" and manifest.vision.max_abs_diff < 1e-4 and manifest.model_type == request.param
    return model, processor, root / "pkg"


def picture(seed: int, shape: tuple[int, ...]):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))


def reference(model, processor, text: str, pictures: list) -> tuple[list[int], list[int]]:
    inputs = processor(text=[text], images=[pictures] if pictures else None, return_tensors="pt")
    inputs.pop("token_type_ids", None)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    return inputs["input_ids"][0].tolist(), out[0, inputs["input_ids"].shape[1]:].tolist()


def test_tiles_equal_idefics3_image_processor(idefics):
    _, processor, package = idefics
    settings = ortinf.manifest.Manifest.load(package).vision.processor
    # images are first scaled to a 56-px longest edge, then cut: 2x2 tiles, or 2x1 for a tall one
    for seed, shape, layout in ((1, (40, 70, 3), (2, 2)), (2, (20, 25, 3), (2, 2)), (3, (90, 30, 3), (2, 1)), (4, (56, 56, 3), (2, 2))):
        image = picture(seed, shape)
        tiles, rows, cols = idefics_tiles(image, settings)
        expected = processor.image_processor(image, return_tensors="np", return_row_col_info=True)
        assert (rows, cols) == layout == (expected["rows"][0][0], expected["cols"][0][0])
        np.testing.assert_allclose(tiles, expected["pixel_values"][0], atol=1e-5)


def test_ragged_batches_equal_transformers(idefics):
    model, processor, package = idefics
    a, b, c = picture(1, (40, 70, 3)), picture(2, (20, 25, 3)), picture(3, (90, 30, 3))
    cases = [("the cat<image>is brown", [a]), ("a small dog", []), ("<image>and<image>watch", [b, c]), ("<image>" + " the fox" * 8, [c])]
    expected = [reference(model, processor, text, pictures) for text, pictures in cases]
    prompts = [{"prompt": text, "multi_modal_data": {"image": pictures}} if pictures else text for text, pictures in cases]
    llm = LLM(package, max_num_seqs=8)
    outputs = llm.generate(prompts, GREEDY)
    assert [o.prompt_token_ids for o in outputs] == [ids for ids, _ in expected]  # Idefics3Processor's expansion
    assert [o.outputs[0].token_ids for o in outputs] == [tokens for _, tokens in expected]
    assert llm.engine.runner.vision.num_encoded == 3
    tight = LLM(package, max_num_seqs=3, num_blocks=13, block_size=8, max_model_len=104, max_num_batched_tokens=16)
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, GREEDY)] == [tokens for _, tokens in expected]
    assert tight.engine.scheduler.stats.num_preemptions > 0


def test_unsplit_images_equal_transformers(idefics, tmp_path):
    """do_image_splitting off: each image is one tile at the tower's size (the layout without rows)."""
    import json
    import shutil

    model, processor, package = idefics
    shutil.copytree(package, tmp_path / "pkg")
    manifest = json.loads((tmp_path / "pkg" / "ortinf.json").read_text())
    manifest["vision"]["processor"]["do_image_splitting"] = False
    (tmp_path / "pkg" / "ortinf.json").write_text(json.dumps(manifest))
    processor.image_processor.do_image_splitting = False
    try:
        ids, tokens = reference(model, processor, "look<image>here", [picture(5, (30, 50, 3))])
    finally:
        processor.image_processor.do_image_splitting = True
    out = LLM(tmp_path / "pkg").generate({"prompt": "look<image>here", "multi_modal_data": {"image": picture(5, (30, 50, 3))}}, GREEDY)[0]
    assert out.prompt_token_ids == ids and out.outputs[0].token_ids == tokens


def test_an_expanded_prompt_is_refused_with_what_to_send(idefics):
    _, processor, package = idefics
    llm = LLM(package)
    image_token = ortinf.manifest.Manifest.load(package).vision.image_token_id
    with pytest.raises(RequestError, match="one image token"):
        llm.generate({"prompt_token_ids": [5, image_token, image_token, 7], "multi_modal_data": {"image": picture(1, (20, 20, 3))}}, GREEDY)
    assert llm.generate(["a dog"], GREEDY)[0].outputs[0].token_ids  # the engine goes on
