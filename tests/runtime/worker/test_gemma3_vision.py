"""Gemma 3 with images on the one engine (issue 33): a tiny random Gemma3ForConditionalGeneration exported by
`ortinf export`. An image's tokens attend to each other both ways at prefill (transformers' token_type_ids mask):
the graph takes `attend_until` and the scheduler never ends a prefill chunk inside an image. Greedy tokens equal
transformers' generate on ragged batches mixing image and text-only requests, one and two images per prompt, with a
step budget that chunks prompts around images and a pool that preempts; the numpy preprocessing equals
Gemma3ImageProcessor; an image longer than a step is a RequestError naming the option."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from support.tiny_models import GEMMA3_TOKENS, add_tokenizer, build_gemma3_vl

import ortinf
from ortinf import LLM, SamplingParams
from ortinf.errors import RequestError
from ortinf.runtime.worker.encoder_input import EncoderInput, PlacedImage
from ortinf.runtime.worker.image_spans import attend_until, whole_image_chunk
from ortinf.runtime.worker.images import clip_pixels

Image = pytest.importorskip("PIL.Image")
BOI, IMAGE = GEMMA3_TOKENS["boi_token_index"], GEMMA3_TOKENS["image_token_index"]
NEW = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3")
    model = build_gemma3_vl(root / "hf")
    add_tokenizer(root / "hf", 280)
    processor = transformers.Gemma3ImageProcessor.from_pretrained(root / "hf")
    manifest = ortinf.export(root / "hf", root / "pkg", progress=False)
    from ortinf.kernels import library

    assert manifest.vision.whole_images and manifest.decoder.image_spans
    assert (manifest.cpu_kernel is not None) == (library.load() is not None)  # the kernel library draws the spans too
    assert manifest.vision.max_abs_diff < 1e-4
    return model, processor, root / "pkg", manifest.vision


def images(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for shape in ((40, 60, 3), (56, 56, 3), (61, 29, 3))]


def expand(ids: list[int], vision) -> list[int]:  # Gemma3Processor's expansion of <start_of_image>
    return [t for token in ids for t in ([*vision.image_prefix_ids, *[IMAGE] * 16, *vision.image_suffix_ids] if token == BOI else [token])]


def reference(model, processor, ids: list[int], pictures: list, vision) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and their log-probabilities (greedy tokens alone would miss a causal image: on a
    random model its logits move by ~1e-3, rarely enough to flip a token)."""
    ids = expand(ids, vision)
    prompt = torch.tensor([ids])
    extra = {"pixel_values": torch.from_numpy(processor(pictures, return_tensors="np")["pixel_values"]),
             "token_type_ids": (prompt == IMAGE).long()} if pictures else {}
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True, **extra)
    tokens = out.sequences[0, len(ids):].tolist()
    return tokens, [float(torch.log_softmax(score[0], -1)[t]) for score, t in zip(out.logits, tokens)]


def check(outputs, expected) -> None:
    assert [o.outputs[0].token_ids for o in outputs] == [tokens for tokens, _ in expected]
    for output, (_, logprobs) in zip(outputs, expected):
        np.testing.assert_allclose([p.logprob for p in output.outputs[0].logprobs], logprobs, atol=2e-5)


def test_preprocessing_equals_gemma3_image_processor(gemma):
    _, processor, _, vision = gemma
    rng = np.random.default_rng(1)
    for shape, mode in (((40, 60, 3), "RGB"), ((200, 90, 3), "RGB"), ((28, 28, 4), "RGBA"), ((33, 50), "L")):
        picture = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode)
        np.testing.assert_allclose(clip_pixels(picture, vision.processor), processor(picture, return_tensors="np")["pixel_values"][0], atol=1e-5)


def test_image_spans_and_chunks():
    placed = [PlacedImage(3, EncoderInput.of(np.zeros(1), 4, "image"), whole=True), PlacedImage(10, EncoderInput.of(np.ones(1), 2, "image"))]
    np.testing.assert_array_equal(attend_until(placed, 0, 13), [0, 1, 2, 6, 6, 6, 6, 7, 8, 9, 10, 11, 12])
    np.testing.assert_array_equal(attend_until(placed, 5, 8), [6, 6, 7])
    assert [whole_image_chunk(placed, 0, n) for n in (3, 4, 6, 7, 11)] == [3, 3, 3, 7, 11]  # never ends inside 3..6
    assert whole_image_chunk(placed, 3, 2) == 0 and whole_image_chunk(placed, 5, 2) == 2  # from inside: to its end or nothing
    assert whole_image_chunk(placed, 0, 11) == 11  # the other image may be split


def test_bidirectional_attention_matters(gemma):
    """The check can fail: transformers without token_type_ids (causal image tokens) gives other logits."""
    model, processor, _, vision = gemma
    ids = torch.tensor([expand([5, BOI, 9, 11], vision)])
    pixels = torch.from_numpy(processor(images()[:1], return_tensors="np")["pixel_values"])
    with torch.no_grad():
        both = model(input_ids=ids, pixel_values=pixels, token_type_ids=(ids == IMAGE).long()).logits[0, -1]
        causal = model(input_ids=ids, pixel_values=pixels).logits[0, -1]
    assert float((both - causal).abs().max()) > 1e-3


def test_ragged_batches_of_images_and_text_equal_transformers(gemma):
    model, processor, package, vision = gemma
    a, b, c = images()
    cases = [([2, 5, BOI, 9, 11], [a]), ([2, 5, 8, 9, 30, 31], []), ([2, 5, BOI, 12, BOI, 40], [b, c]), ([2, BOI, *range(20, 50)], [c]),
             ([2, 3, 4], [])]
    expected = [reference(model, processor, ids, pictures, vision) for ids, pictures in cases]
    prompts = [{"prompt_token_ids": ids, "multi_modal_data": {"image": pictures}} if pictures else ids for ids, pictures in cases]
    for cpu_kernel in (None, False):  # ortinf's CPU kernel graph (where the library is built) and the portable graph
        llm = LLM(package, max_num_seqs=8, cpu_kernel=cpu_kernel)
        check(llm.generate(prompts, GREEDY), expected)
    # a step budget of 20 tokens: prompts are chunked, never inside an image (16 tokens); a pool that preempts
    tight = LLM(package, max_num_seqs=3, num_blocks=14, block_size=8, max_model_len=112, max_num_batched_tokens=20)
    check(tight.generate(prompts, GREEDY), expected)
    assert tight.engine.scheduler.stats.num_preemptions > 0


def test_an_image_longer_than_a_step_is_a_request_error(gemma):
    _, _, package, _ = gemma
    llm = LLM(package, max_num_batched_tokens=12)
    with pytest.raises(RequestError, match="--max-num-batched-tokens 16"):
        llm.generate({"prompt_token_ids": [2, 5, BOI], "multi_modal_data": {"image": images()[0]}}, GREEDY)
    assert llm.generate([[2, 5, 6]], GREEDY)[0].outputs[0].token_ids  # the engine goes on


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_every_build_the_machine_runs(isa):
    """The image spans again under the kernel library's narrower builds (each reads attend_until in its own job code)."""
    import importlib.util
    from pathlib import Path

    from ortinf.kernels import library

    if library.load() is None:
        pytest.skip("ortinf's CPU kernel library is not built here")
    if isa == "avx2" and "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX2")
    spec = importlib.util.spec_from_file_location("builds", Path(__file__).parents[2] / "kernels" / "builds.py")
    builds = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builds)
    builds.rerun_under(isa, __file__, "library.load().isa")
