"""Vision-language serving: ortinf's LLaVA and Qwen2.5-VL paths beside transformers, time to first token and throughput.

usage: .venv/bin/python benchmarks/vision.py [--family llava|qwen2_5_vl] [--size small|400m] [--tiny] [--record]

--family qwen2_5_vl: a Qwen2.5-VL of random weights, --size 400m a 12-layer, 768-wide windowed tower (ViT-B's size;
windows of 4x4 tokens, full attention in blocks 3, 7 and 11) under the same Qwen2.5-0.5B-shaped language model with
M-RoPE; images of 448x448 px and up (256 tokens and more, each its own size).

A LLaVA of random weights built from transformers' config classes: --size 400m is a CLIP ViT-B/16 tower at
224 px (196 image tokens) under a Qwen2.5-0.5B-shaped llama (hidden 896, 24 layers, 14 heads / 2 KV,
vocab 32000), about 450M parameters; small is a 4-layer tower and a 4-layer llama; --tiny a 2-layer one.
Workload: 1 and 8 concurrent requests, each one image (a different random picture) and 16 text tokens,
32 greedy new tokens, no EOS stop. ortinf runs all requests at once (LLM.generate) and reports the
vision graph's time apart (its calls, timed inside the runner); transformers runs each request alone
(generate with pixel_values: its own prefill of the image). TTFT: ortinf, one request with max_tokens 1;
transformers, generate(max_new_tokens=1). Not beside OpenVINO GenAI's VLMPipeline or llama.cpp's
multimodal path: neither is installed as a benchmark environment here yet (the first needs optimum-intel's
conversion of the checkpoint, the second an mmproj GGUF of the tower), so they are not in the table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from record import finish  # noqa: E402

from ortinf.matrix import machine  # noqa: E402

SIZES = {
    "tiny": (dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=28, patch_size=7),
             dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)),
    "small": (dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4, image_size=224, patch_size=16),
              dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)),
    "400m": (dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=224, patch_size=16),
             dict(vocab_size=32000, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2)),
}
NEW_TOKENS, TEXT_TOKENS = 32, 16
QWEN_VISION = {
    "tiny": dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=64, window_size=56, fullatt_block_indexes=[1]),
    "small": dict(depth=4, hidden_size=256, intermediate_size=1024, num_heads=4, out_hidden_size=512, window_size=112,
                  fullatt_block_indexes=[3]),
    "400m": dict(depth=12, hidden_size=768, intermediate_size=3072, num_heads=12, out_hidden_size=896, window_size=112,
                 fullatt_block_indexes=[3, 7, 11]),
}


def build_qwen(folder: Path, size: str) -> None:
    import torch
    import transformers

    _, text = SIZES[size]
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    vocab = text["vocab_size"]
    config = transformers.Qwen2_5_VLConfig(
        vision_config=dict(**QWEN_VISION[size], patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
        text_config=dict(text, max_position_embeddings=4096, rope_scaling={"type": "mrope", "mrope_section": qwen_sections(head_dim)}),
        vision_start_token_id=vocab - 4, vision_end_token_id=vocab - 3, image_token_id=vocab - 2, video_token_id=vocab - 1)
    torch.manual_seed(0)
    transformers.Qwen2_5_VLForConditionalGeneration(config).eval().save_pretrained(folder)
    side = 56 if size == "tiny" else 448
    transformers.Qwen2VLImageProcessor(max_pixels=side * side * 2).save_pretrained(folder)


def qwen_sections(head_dim: int) -> list[int]:
    """Qwen2.5-VL's M-RoPE split of head_dim / 2 rotary frequencies (16, 24, 24 of 64), scaled to the head size."""
    half = head_dim // 2
    first = half // 4
    return [first, (half - first) // 2, half - first - (half - first) // 2]


def build(folder: Path, size: str) -> None:
    import torch
    import transformers

    vision, text = SIZES[size]
    tokens = (vision["image_size"] // vision["patch_size"]) ** 2
    config = transformers.LlavaConfig(vision_config=transformers.CLIPVisionConfig(**vision, projection_dim=vision["hidden_size"]),
                                      text_config=transformers.LlamaConfig(**text, max_position_embeddings=1024),
                                      image_token_index=text["vocab_size"] - 1, image_seq_length=tokens)
    torch.manual_seed(0)
    transformers.LlavaForConditionalGeneration(config).eval().save_pretrained(folder)
    size_px = vision["image_size"]
    transformers.CLIPImageProcessor(size={"shortest_edge": size_px}, crop_size={"height": size_px, "width": size_px}).save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["llava", "qwen2_5_vl"], default="llava", help="the model's family")
    parser.add_argument("--size", choices=["small", "400m"], default="small", help="the model's shape")
    parser.add_argument("--vision-dtype", choices=["fp32", "int8"], default="fp32",
                        help="ortinf's vision tower precision (int8: its QMatMul graph; transformers stays fp32)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (the smoke test)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    import numpy as np
    import torch
    import transformers
    from PIL import Image

    from ortinf import LLM, SamplingParams, export

    torch.set_num_threads(2)
    size = "tiny" if args.tiny else args.size
    work = Path(tempfile.mkdtemp(prefix="ortinf-vision-"))
    qwen = args.family == "qwen2_5_vl"
    (build_qwen if qwen else build)(work / "hf", size)
    start = time.monotonic()
    export(work / "hf", work / "pkg", progress=False, vision_dtype=args.vision_dtype)
    export_seconds = time.monotonic() - start
    model_class = transformers.Qwen2_5_VLForConditionalGeneration if qwen else transformers.LlavaForConditionalGeneration
    model = model_class.from_pretrained(work / "hf").eval()
    processor = (transformers.Qwen2VLImageProcessor if qwen else transformers.CLIPImageProcessor).from_pretrained(work / "hf")
    config = model.config
    rng = np.random.default_rng(0)
    if qwen:
        image_token = config.image_token_id
        side = 56 if size == "tiny" else 448
        around = ([config.vision_start_token_id], [config.vision_end_token_id])
    else:
        image_token, per_image = config.image_token_index, config.image_seq_length
        side = config.vision_config.image_size
        around = ([], [])
    pictures = [Image.fromarray(rng.integers(0, 256, (side + 28 * (i % 2), side, 3), dtype=np.uint8)) for i in range(8)]
    texts = [rng.integers(3, config.text_config.vocab_size - 5, TEXT_TOKENS).tolist() for _ in range(8)]

    def tokens_of(picture) -> int:
        if not qwen:
            return per_image
        return int(processor(picture, return_tensors="np")["image_grid_thw"].prod() // 4)

    def pixel_inputs(picture) -> dict:
        out = processor(picture, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], **({"image_grid_thw": out["image_grid_thw"]} if qwen else {})}
    llm = LLM(work / "pkg", provider="cpu", intra_op_threads=2, enable_prefix_caching=False)
    vision = llm.engine.runner.vision
    session_run = vision.session.run
    vision_seconds = [0.0]

    def timed(*a, **k):
        begin = time.monotonic()
        try:
            return session_run(*a, **k)
        finally:
            vision_seconds[0] += time.monotonic() - begin

    vision.session.run = timed

    def ortinf(count: int, tokens: int) -> tuple[float, list[list[int]]]:
        llm.engine.scheduler.encoder_cache.clear()  # every image encoded again (the scheduler decides what the runner holds)
        prompts = [{"prompt_token_ids": [1, *around[0], image_token, *around[1], *texts[i]], "multi_modal_data": {"image": pictures[i]}}
                   for i in range(count)]
        begin = time.monotonic()
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
        return time.monotonic() - begin, [o.outputs[0].token_ids for o in outs]

    def hf(count: int, tokens: int) -> tuple[float, list[list[int]]]:
        begin, out = time.monotonic(), []
        with torch.no_grad():
            for i in range(count):
                ids = torch.tensor([[1, *around[0], *[image_token] * tokens_of(pictures[i]), *around[1], *texts[i]]])
                rows = model.generate(ids, attention_mask=torch.ones_like(ids), **pixel_inputs(pictures[i]), max_new_tokens=tokens,
                                      min_new_tokens=tokens, do_sample=False, pad_token_id=0)
                out.append(rows[0, ids.shape[1]:].tolist())
        return time.monotonic() - begin, out

    ortinf(1, 2)  # warm-up
    rows = []
    for count in (1, 8):
        vision_seconds[0] = 0.0
        ttft, _ = ortinf(1, 1) if count == 1 else (float("nan"), None)
        vision_seconds[0] = 0.0
        seconds, tokens = ortinf(count, NEW_TOKENS)
        spent_vision = vision_seconds[0]
        hf_ttft, _ = hf(1, 1) if count == 1 else (float("nan"), None)
        hf_seconds, hf_tokens = hf(count, NEW_TOKENS)
        same = sum(a == b for a, b in zip(tokens, hf_tokens))
        ms = (lambda t: "-" if t != t else f"{t * 1000:.0f}")  # noqa: E731 - TTFT is measured for one request alone
        rows.append(f"| {count} | {ms(ttft)} | {ms(hf_ttft)} | {count * NEW_TOKENS / seconds:.1f} | "
                    f"{count * NEW_TOKENS / hf_seconds:.1f} | {hf_seconds / seconds:.2f}x | {spent_vision * 1000:.0f} of {seconds * 1000:.0f} | "
                    f"{same}/{count} |")
    per_image = "-".join(sorted({str(tokens_of(p)) for p in pictures}))
    name = "Qwen2.5-VL" if qwen else "LLaVA"
    tower = "" if args.vision_dtype == "fp32" else f", ortinf's tower {args.vision_dtype}"
    lines = [f"### Vision-language ({name}{tower}, {size}: {per_image} image tokens, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
             f"parameters, random weights; {TEXT_TOKENS} text tokens + 1 image, {NEW_TOKENS} greedy tokens)", "",
             f"Machine: {machine()}; export {export_seconds:.0f} s", "",
             "| requests | ortinf TTFT ms | transformers TTFT ms | ortinf tok/s | transformers tok/s | speed-up | ortinf vision ms of total | "
             "greedy = transformers |", "|---|---|---|---|---|---|---|---|", *rows]
    finish(lines, args.record)


if __name__ == "__main__":
    main()
