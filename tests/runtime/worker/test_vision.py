"""Vision-language models on the one engine (issue 33, LLaVA first): a tiny random LLaVA (CLIP tower, projector,
Llama) exported by `ortinf export`, then ragged batches mixing image and text-only requests, one and two images
of different sizes per prompt, a pool that preempts, and a conversation that re-sends its image: greedy tokens
equal transformers' LlavaForConditionalGeneration.generate; the numpy preprocessing equals CLIPImageProcessor;
bad images are RequestErrors that name the problem and leave the engine serving."""

from __future__ import annotations

import dataclasses
import io
import struct
import zlib

import numpy as np
import pytest
import torch
import transformers
from support.tiny_models import add_tokenizer, build_llava

import ortinf
from ortinf import LLM, SamplingParams
from ortinf.errors import RequestError
from ortinf.runtime.core.encoder_cache import EncoderCache
from ortinf.runtime.worker.images import clip_pixels, load_image

Image = pytest.importorskip("PIL.Image")
IMAGE_TOKEN, TOKENS_PER_IMAGE, NEW = 299, 16, 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    root = tmp_path_factory.mktemp("llava")
    model = build_llava(root / "hf", IMAGE_TOKEN)
    add_tokenizer(root / "hf", 300)
    processor = transformers.CLIPImageProcessor.from_pretrained(root / "hf")
    manifest = ortinf.export(root / "hf", root / "pkg", progress=False)
    assert manifest.vision is not None and manifest.vision.max_abs_diff < 1e-4 and "image_embeds" in manifest.inputs
    return model, processor, root / "pkg"


def images(seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for shape in ((40, 60, 3), (28, 28, 3), (61, 29, 3))]


def reference(model, processor, ids: list[int], pictures: list) -> list[int]:
    expanded = [t for token in ids for t in ([IMAGE_TOKEN] * TOKENS_PER_IMAGE if token == IMAGE_TOKEN else [token])]
    extra = {"pixel_values": torch.from_numpy(processor(pictures, return_tensors="np")["pixel_values"])} if pictures else {}
    with torch.no_grad():
        out = model.generate(torch.tensor([expanded]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0, **extra)
    return out[0, len(expanded):].tolist()


def test_preprocessing_equals_clip_image_processor(llava):
    _, processor, package = llava
    settings = ortinf.manifest.Manifest.load(package).vision.processor
    rng = np.random.default_rng(1)
    for shape, mode in (((40, 60, 3), "RGB"), ((61, 29, 3), "RGB"), ((28, 28, 4), "RGBA"), ((33, 50), "L"), ((20, 15, 3), "RGB")):
        picture = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode)
        np.testing.assert_allclose(clip_pixels(picture, settings), processor(picture, return_tensors="np")["pixel_values"][0], atol=1e-5)


def test_ragged_batches_of_images_and_text_equal_transformers(llava):
    model, processor, package = llava
    a, b, c = images()
    cases = [([5, 7, IMAGE_TOKEN, 9, 11], [a]), ([5, 8, 9, 30, 31], []), ([5, IMAGE_TOKEN, 12, IMAGE_TOKEN, 40], [b, c]),
             ([IMAGE_TOKEN, *range(20, 60)], [c]), ([3, 4], [])]
    expected = [reference(model, processor, ids, pictures) for ids, pictures in cases]
    prompts = [{"prompt_token_ids": ids, "multi_modal_data": {"image": pictures}} if pictures else ids for ids, pictures in cases]
    llm = LLM(package, max_num_seqs=8)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == expected
    # two slots and a pool that cannot hold every sequence: requests are preempted mid-prompt and recomputed, with
    # their images' embeddings kept (no second vision call)
    tight = LLM(package, max_num_seqs=2, num_blocks=14, block_size=8, max_model_len=112, max_num_batched_tokens=24)
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, GREEDY)] == expected
    assert tight.engine.scheduler.stats.num_preemptions > 0 and tight.engine.runner.vision.num_encoded == 3


def test_a_small_encoder_cache_decides_what_the_runner_holds(llava):
    """The scheduler's encoder cache at 2 images (ortinf/runtime/core/encoder_cache.py) and three requests with four different
    images whose prefills interleave (8 tokens a request a step, so each image spans two steps): the runner holds exactly
    the images the scheduler decides, never more than 2, never encodes one it holds, never lacks one a step needs (its
    chunk would raise), and the tokens are those of the default cache."""
    _, _, package = llava
    a, b, c = images()
    d = images(1)[0]
    prompts = [{"prompt_token_ids": [5, IMAGE_TOKEN, 9, 10, IMAGE_TOKEN, 11], "multi_modal_data": {"image": [a, d]}},
               {"prompt_token_ids": [6, 7, IMAGE_TOKEN, 12, 13], "multi_modal_data": {"image": b}},
               {"prompt_token_ids": [IMAGE_TOKEN, 14, 15], "multi_modal_data": {"image": c}}]
    expected = [o.outputs[0].token_ids for o in LLM(package).generate(prompts, GREEDY)]
    small = LLM(package, max_num_batched_tokens=24)
    scheduler, runner, vision = small.engine.scheduler, small.engine.runner, small.engine.runner.vision
    scheduler.encoder_cache = EncoderCache(2)
    scheduler.config = dataclasses.replace(scheduler.config, long_prefill_token_threshold=8)
    execute, most_in_use = runner.execute, [0]

    def checked(out):
        assert not {p.image.digest for p in out.encode_images} & (set(vision.cache) - set(out.free_image_digests))
        result = execute(out)
        assert len(vision.cache) <= 2 and set(vision.cache) == set(scheduler.encoder_cache.held)
        most_in_use[0] = max(most_in_use[0], len({p.image.digest for s in out.scheduled for p in s.images
                                                  if p.offset < s.num_computed_tokens + len(s.token_ids) and p.end > s.num_computed_tokens}))
        return result

    runner.execute = checked
    assert [o.outputs[0].token_ids for o in small.generate(prompts, GREEDY)] == expected
    assert vision.num_encoded >= 4 and most_in_use[0] == 2


def test_a_failed_vision_call_fails_its_request_alone_and_leaves_the_cache_in_step(llava):
    """A vision call that raises for one image: the engine's one-by-one re-run fails that request alone; the scheduler frees
    the image it had allocated (the runner never held it), so the same image later is encoded again, not taken as held."""
    _, _, package = llava
    a, b, _ = images()
    llm = LLM(package)
    vision = llm.engine.runner.vision
    encode, broken = vision.family.encode, [llm.engine.prepare([5, IMAGE_TOKEN], GREEDY, images=[b]).images[0].image.digest]

    def failing(run, batch, spec):
        if any(p.image.digest in broken for p in batch):
            raise RuntimeError("the vision graph failed")
        return encode(run, batch, spec)

    vision.family = dataclasses.replace(vision.family, encode=failing)
    ids = [llm.engine.add_request(llm.engine.prepare([5, IMAGE_TOKEN, 9], GREEDY, images=[picture])) for picture in (a, b)]
    final = {}
    while llm.engine.has_unfinished_requests():
        final.update({o.request_id: o for o in llm.engine.step() if o.finished})
    assert len(final[ids[0]].outputs[0].token_ids) == NEW and final[ids[0]].error is None and final[ids[1]].error is not None
    assert broken[0] not in llm.engine.scheduler.encoder_cache.held and broken[0] not in vision.cache
    broken.clear()
    prompt = {"prompt_token_ids": [5, IMAGE_TOKEN, 9], "multi_modal_data": {"image": b}}
    assert llm.generate(prompt, GREEDY)[0].outputs[0].token_ids == LLM(package).generate(prompt, GREEDY)[0].outputs[0].token_ids


def test_an_image_sent_again_costs_no_vision_call_and_hits_the_prefix_cache(llava):
    model, processor, package = llava
    a, b, _ = images()
    llm = LLM(package)
    first = [5, 7, IMAGE_TOKEN, 9]
    reply = llm.generate({"prompt_token_ids": first, "multi_modal_data": {"image": a}}, GREEDY)[0].outputs[0].token_ids
    hits = llm.engine.kv_cache.stats.num_hits
    second = first + reply + [13, 14]  # the next turn: the conversation so far, the same image
    again = llm.generate({"prompt_token_ids": second, "multi_modal_data": {"image": a}}, GREEDY)[0].outputs[0].token_ids
    assert again == reference(model, processor, second, [a])
    assert llm.engine.runner.vision.num_encoded == 1
    assert llm.engine.kv_cache.stats.num_hits - hits >= 16  # the image's blocks came from the cache
    other = llm.generate({"prompt_token_ids": second, "multi_modal_data": {"image": b}}, GREEDY)[0].outputs[0].token_ids
    assert other == reference(model, processor, second, [b])  # the same tokens over another image share no block


def _png_header(width: int, height: int) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))


def test_bad_images_are_request_errors_and_the_engine_goes_on(llava):
    _, _, package = llava
    llm = LLM(package)
    good = io.BytesIO()
    images()[0].save(good, format="PNG")
    bomb = io.BytesIO()
    Image.new("L", (7500, 7500)).save(bomb, format="PNG")  # 56 M pixels in ~60 KB
    cases = {
        "truncated": good.getvalue()[: len(good.getvalue()) // 2],
        "a 30000x30000 header": _png_header(30000, 30000),
        "a 0x0 header": _png_header(0, 0),
        "an SVG": b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
        "a decompression bomb": bomb.getvalue(),
        "not bytes": 3.5,
    }
    for name, data in cases.items():
        with pytest.raises(RequestError) as caught:
            llm.generate({"prompt_token_ids": [5, IMAGE_TOKEN], "multi_modal_data": {"image": data}}, GREEDY)
        assert caught.value.param == "image", name
    with pytest.raises(RequestError, match="2 image placeholders for 1 images"):
        llm.generate({"prompt_token_ids": [IMAGE_TOKEN, 5, IMAGE_TOKEN], "multi_modal_data": {"image": good.getvalue()}}, GREEDY)
    with pytest.raises(RequestError, match="multi_modal_data takes 'image' only"):
        llm.generate({"prompt_token_ids": [5], "multi_modal_data": {"audio": b""}}, GREEDY)
    assert load_image(good.getvalue()).size == (60, 40)
    assert len(llm.generate({"prompt_token_ids": [5, IMAGE_TOKEN], "multi_modal_data": {"image": good.getvalue()}}, GREEDY)[0]
               .outputs[0].token_ids) == NEW


def test_int8_language_model_with_images(llava, tmp_path):
    """The language model quantized as any decoder (int8 MatMulNBits and the CPU kernel graph's QMatMul, both with
    the image merge); the vision tower stays fp32; the quality gate measures the text path."""
    _, _, package = llava
    manifest = ortinf.export(package.parent / "hf", tmp_path / "int8", dtype="int8",
                             progress=False, quality_gate="record")
    assert manifest.dtype == "int8" and manifest.vision.max_abs_diff < 0.1 and manifest.quality is not None
    prompt = {"prompt_token_ids": [5, 7, IMAGE_TOKEN, 9, 11], "multi_modal_data": {"image": images()[0]}}
    full = LLM(package).generate(prompt, GREEDY)[0].outputs[0].token_ids
    for options in ({}, {"cpu_kernel": False}):
        quantized = LLM(tmp_path / "int8", **options).generate(prompt, GREEDY)[0].outputs[0].token_ids
        assert len(quantized) == NEW and len(full) == NEW  # which tokens is the gate's business (its figures vary by CPU)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_quantized_vision_tower(llava, tmp_path, dtype):
    """--vision-dtype: the tower's MatMuls as MatMulNBits, gated by its embeddings' cosine similarity to fp32's (recorded in
    the manifest); the language model stays fp32; images still run through the engine."""
    import onnx

    model, processor, package = llava
    manifest = ortinf.export(package.parent / "hf", tmp_path / dtype, vision_dtype=dtype, progress=False)
    assert manifest.dtype == "fp32" and manifest.vision.dtype == dtype and manifest.vision.embedding_cosine >= 0.9
    graph = onnx.load(str(tmp_path / dtype / "vision.onnx"), load_external_data=False).graph
    assert any(n.op_type == "MatMulNBits" for n in graph.node)
    prompt = {"prompt_token_ids": [5, 7, IMAGE_TOKEN, 9, 11], "multi_modal_data": {"image": images()[0]}}
    from ortinf.kernels import library

    if library.load() is not None:  # and the kernel library's QMatMul graph of the tower, which the CPU provider runs
        assert manifest.vision.cpu_graph == "vision.cpu.onnx" and (tmp_path / dtype / "vision.cpu.onnx").is_file()
    for cpu_kernel in (None, False):
        llm = LLM(tmp_path / dtype, cpu_kernel=cpu_kernel)
        assert llm.engine.runner.vision.graph_file == (manifest.vision.cpu_graph or "vision.onnx" if cpu_kernel is None else "vision.onnx")
        assert len(llm.generate(prompt, GREEDY)[0].outputs[0].token_ids) == NEW


def test_vision_dtype_is_refused_for_text_models(tmp_path):
    from support.tiny_models import build_decoder

    build_decoder("llama", tmp_path / "hf")
    with pytest.raises(ortinf.errors.ExportError, match="--vision-dtype is for vision-language models"):
        ortinf.export(tmp_path / "hf", tmp_path / "pkg", vision_dtype="int8", progress=False)


def test_the_step_budgets_image_work(llava):
    """--max-num-encoder-input-tokens bounds the image tokens the vision graph runs per step: at 16 (one LLaVA image), three
    new images run in three steps' calls instead of one batched call; the tokens are the same; a kept image costs nothing."""
    _, _, package = llava
    a, b, c = images()
    prompts = [{"prompt_token_ids": [5, IMAGE_TOKEN, 7 + i], "multi_modal_data": {"image": picture}} for i, picture in enumerate((a, b, c))]
    batched = LLM(package)
    expected = [o.outputs[0].token_ids for o in batched.generate(prompts, GREEDY)]
    assert batched.engine.runner.vision.num_calls == 1
    budgeted = LLM(package, max_num_encoder_input_tokens=16)
    assert [o.outputs[0].token_ids for o in budgeted.generate(prompts, GREEDY)] == expected
    assert budgeted.engine.runner.vision.num_calls == 3 and budgeted.engine.runner.vision.num_encoded == 3
    again = [{"prompt_token_ids": [6, IMAGE_TOKEN, 8], "multi_modal_data": {"image": picture}} for picture in (a, b, c)]
    budgeted.generate(again, GREEDY)  # all three kept: one step may take them all, and no call runs
    assert budgeted.engine.runner.vision.num_calls == 3


def test_beam_search_over_an_image_equals_transformers(llava):
    """Beam search (one step request per beam, ortinf/tasks/beams.py) carries the prompt's image into every step:
    the hypotheses equal transformers' generate(num_beams=3) with the same pixels."""
    model, processor, package = llava
    ids = [5, 7, IMAGE_TOKEN, 9, 11]
    picture = images()[0]
    expanded = [t for token in ids for t in ([IMAGE_TOKEN] * TOKENS_PER_IMAGE if token == IMAGE_TOKEN else [token])]
    pixels = torch.from_numpy(processor(picture, return_tensors="np")["pixel_values"])
    with torch.no_grad():
        out = model.generate(torch.tensor([expanded]), attention_mask=torch.ones(1, len(expanded), dtype=torch.long), pixel_values=pixels,
                             num_beams=3, num_return_sequences=3, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0,
                             early_stopping=True)
    expected = [row[len(expanded):].tolist() for row in out]
    beams = SamplingParams(num_beams=3, n=3, max_tokens=6, ignore_eos=True, early_stopping=True)
    got = LLM(package).generate({"prompt_token_ids": ids, "multi_modal_data": {"image": picture}}, beams)[0]
    assert [o.token_ids for o in got.outputs] == expected
