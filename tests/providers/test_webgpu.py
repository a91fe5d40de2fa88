"""The GPU-style provider that runs here: WebGPU (onnxruntime-ep-webgpu) on Mesa's software Vulkan
driver. Its tensors live in WebGPU buffers, so these tests exercise the device-resident pool for
real: greedy parity through the engine, the pool staying on the device, placement, and a server.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from openai import OpenAI
from support.attention import attend, causal
from support.engine_helpers import GREEDY, hf_greedy, run_to_completion
from support.server_helpers import running_server

import ortinf
from ortinf import LLM, SamplingParams
from ortinf.config import EngineConfig
from ortinf.errors import ConfigError
from ortinf.manifest import LOGITS
from ortinf.providers.session import create_session
from ortinf.runtime.engine.llm_engine import LLMEngine
from ortinf.runtime.worker.decoder_graph import DecoderGraph
from ortinf.runtime.worker.model_input import SequenceChunk, build_model_input

LENGTHS = [1, 5, 17, 31, 64, 70]


def parity_prompts() -> list[list[int]]:
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 256, n).tolist() for n in LENGTHS]
    prompts.append(prompts[4][:48] + [7, 8, 9])  # shares 3 full blocks with prompt 4: a prefix hit
    return prompts


@pytest.mark.parametrize("buckets", [False, True], ids=["exact-shapes", "shape-buckets"])
def test_engine_greedy_parity_on_webgpu(webgpu, decoder_package, buckets):
    """Ragged prompts, chunked prefill (48-token steps), a prefix hit and preemption (14 blocks),
    with steps as they come and padded to shape buckets (padding writes into the scratch block)."""
    model, package = decoder_package("llama")
    prompts = parity_prompts()
    expected = [hf_greedy(model, p, GREEDY.max_tokens) for p in prompts]
    engine = LLMEngine(EngineConfig(package_dir=package, provider="webgpu", num_blocks=14, block_size=16,
                                    max_num_batched_tokens=48, max_model_len=128, shape_buckets=buckets))
    assert (engine.graph.buckets is not None) == buckets
    assert engine.graph.pool.values[0].device_name() == "webgpu"
    finished = run_to_completion(engine, prompts)
    assert [finished[str(i)].outputs[0].token_ids for i in range(len(prompts))] == expected
    assert engine.scheduler.stats.num_preemptions > 0
    assert engine.kv_cache.stats.num_hits > 0


def test_the_graph_runs_on_webgpu(webgpu, decoder_package):
    _, package = decoder_package("llama")
    graph = DecoderGraph(package, num_blocks=8, block_size=4, provider=webgpu)
    nodes = graph.placement.nodes
    assert nodes["WebGpuExecutionProvider"] > nodes.get("CPUExecutionProvider", 0)
    assert graph.placement.cpu_compute_ops == {}  # only integer shape/index ops stay on the CPU
    # the graph's in-place write lands in the device pool: exactly the step's slots change
    graph.run(build_model_input([SequenceChunk([5, 6, 7, 8, 9], 0, [6, 2])], 4))
    changed = np.argwhere(np.any(graph.read_pool(0) != 0, axis=(0, 3)))
    assert sorted(map(tuple, changed.tolist())) == [(2, 0), (6, 0), (6, 1), (6, 2), (6, 3)]


def decode_ms(graph: DecoderGraph, host_pool: list[np.ndarray] | None = None) -> float:
    """One decode step of one sequence with 40 cached tokens: through the bound pool, or (host_pool)
    the way a host-resident pool runs, fed to the session every call."""
    model_input = build_model_input([SequenceChunk([9], 40, [3, 1, 4, 0])], 16)
    start = time.perf_counter()
    if host_pool is None:
        graph.run(model_input)
    else:
        feeds = {**model_input.feeds(), **dict(zip(graph.pool.input_names, host_pool))}
        graph.session.run([LOGITS], feeds)
    return (time.perf_counter() - start) * 1e3


def test_decode_time_does_not_grow_with_the_pool(webgpu, decoder_package, record_property, tmp_path):
    """The same step with an 8x larger pool: the bound pool costs the same, the host-fed pool more.

    On the in-memory export's graph (constants folded by the tracer): the streaming export's unfolded graph
    runs this toy step ~25% slower and noisier on the software WebGPU adapter (10 vs 13 ms; issue 42's note),
    which this test is not about."""
    import ortinf

    _, streamed = decoder_package("llama")
    package = tmp_path / "folded"
    ortinf.export(streamed.parent / "hf", package, progress=False, in_memory=True)
    graphs = {size: DecoderGraph(package, num_blocks=size, block_size=16, provider=webgpu) for size in (512, 4096)}
    hosts = {size: [np.zeros(graph.pool.shape, np.float32) for _ in graph.pool.input_names] for size, graph in graphs.items()}
    for size, graph in graphs.items():  # compile and warm both paths
        for _ in range(3):
            decode_ms(graph), decode_ms(graph, hosts[size])
    bound = {size: [] for size in graphs}
    fed = {size: [] for size in graphs}
    for _ in range(15):  # interleaved, so load on the machine hits both sizes alike
        for size, graph in graphs.items():
            bound[size].append(decode_ms(graph))
            fed[size].append(decode_ms(graph, hosts[size]))
    b = {size: float(np.median(v)) for size, v in bound.items()}
    f = {size: float(np.median(v)) for size, v in fed.items()}
    record_property("decode_ms", {"bound": b, "host_fed": f})
    print(f"decode step ms, pool 512 vs 4096 blocks: bound {b[512]:.2f} vs {b[4096]:.2f}; host-fed {f[512]:.2f} vs {f[4096]:.2f}")
    # bound: ~1.0x alone (1.0-1.08x measured on AMD EPYC and Intel Xeon); up to 1.24x inside the full suite on the software
    # Vulkan adapter, whose step times wander with the machine's load. A pool fed per call grows ~2.5-3x; a pool that
    # were copied per call despite the binding would fail both bounds.
    assert b[4096] <= 1.35 * b[512] + 1.0, b
    assert f[4096] >= 1.5 * f[512], f


def test_server_on_webgpu(webgpu, chat_package, tmp_path):
    """`ortinf serve --provider webgpu` answers the official client with the CPU engine's greedy text."""
    prompt = [5, 17, 33, 40, 90, 41, 7]
    messages = [{"role": "user", "content": "hello there"}]
    cpu = LLM(chat_package, provider="cpu", num_blocks=64)
    expected = cpu.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)[0].outputs[0].text
    with running_server([str(chat_package), "--provider", "webgpu", "--kv-cache-memory", "16MiB"], tmp_path, timeout=300) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="x")
        completion = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=8, temperature=0,
                                               extra_body={"ignore_eos": True})
        whole = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=6, temperature=0)
        stream = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=6, temperature=0, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        log = server.log()
    assert completion.choices[0].text == expected and completion.usage.completion_tokens == 8
    assert streamed == whole.choices[0].message.content
    assert "webgpu" in log and "nodes on WebGpuExecutionProvider" in log


@pytest.fixture(scope="module")
def paged_attention_package(webgpu, decoder_package, tmp_path_factory):
    """The tiny llama exported with the contrib paged kernel (fp16); the export verifies it on WebGPU."""
    _, package = decoder_package("llama")
    out = tmp_path_factory.mktemp("pa") / "pkg"
    manifest = ortinf.export(package.parent / "hf", out, dtype="fp16", kernel="paged-attention", progress=False)
    return manifest, out


def greedy_with_margins(model, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens and, per step, the fp32 gap between its best two logits."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True)
    margins = [float(torch.topk(s[0], 2).values[0] - torch.topk(s[0], 2).values[1]) for s in out.scores]
    return out.sequences[0, len(prompt):].tolist(), margins


def test_paged_attention_kernel_on_webgpu(paged_attention_package, decoder_package):
    """The contrib kernel package (fp16) through the engine on WebGPU: the pool is the op's layout on
    the device, prefills are chunked to 31 tokens, and greedy tokens equal transformers' (fp32) up to
    the first step whose top-2 logit gap (< 0.02) fp16 cannot resolve."""
    manifest, package = paged_attention_package
    assert manifest.decoder.kernel == "paged-attention" and manifest.decoder.kv_layout == "num_blocks,block_size,kv_heads,head_dim"
    assert manifest.parity.max_abs_diff <= 5e-2 and "on webgpu" in manifest.parity.description
    model, _ = decoder_package("llama")
    engine = LLMEngine(EngineConfig(package_dir=package, provider="webgpu", num_blocks=14, block_size=16,
                                    max_num_batched_tokens=48, max_model_len=128))
    assert engine.graph.pool.values[0].device_name() == "webgpu" and engine.graph.max_query_len == 31
    assert "PagedAttention" not in engine.graph.placement.cpu_compute_ops
    prompts = parity_prompts()
    finished = run_to_completion(engine, prompts)
    assert engine.scheduler.stats.num_preemptions > 0
    compared = 0
    for i, prompt in enumerate(prompts):
        expected, margins = greedy_with_margins(model, prompt, GREEDY.max_tokens)
        resolvable = next((k for k, m in enumerate(margins) if m < 0.02), len(expected))
        got = finished[str(i)].outputs[0].token_ids
        assert got[:resolvable] == expected[:resolvable], (i, resolvable)
        compared += resolvable
    assert compared >= 100  # most of the 7 x 24 tokens are compared


def test_paged_attention_package_is_refused_on_the_cpu(paged_attention_package):
    _, package = paged_attention_package
    with pytest.raises(ConfigError, match="paged-attention kernel, which runs on cuda, webgpu, not on cpu"):
        DecoderGraph(package, num_blocks=8, block_size=16, provider="cpu")
    with pytest.raises(ConfigError, match="power of two, at least 16"):
        DecoderGraph(package, num_blocks=8, block_size=8, provider="webgpu")


def paged_attention_error(session, new_tokens: int, heads: int = 4, kv_heads: int = 2, head_dim: int = 16) -> float:
    """One sequence of `new_tokens` through a lone PagedAttention node, against numpy attention."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((new_tokens, heads, head_dim)).astype(np.float16)
    k, v = (rng.standard_normal((new_tokens, kv_heads, head_dim)).astype(np.float16) for _ in range(2))
    cache = np.zeros((4, 16, kv_heads, head_dim), np.float16)
    feeds = dict(q=q.reshape(new_tokens, -1), k=k.reshape(new_tokens, -1), v=v.reshape(new_tokens, -1), kc=cache, vc=cache,
                 cu=np.array([0, new_tokens], np.int32), past=np.array([0], np.int32), bt=np.array([[1, 2, 3]], np.int32))
    out = session.run(["o"], feeds)[0].astype(np.float32).reshape(new_tokens, heads, head_dim)
    expected = attend(q, k.transpose(1, 0, 2), v.transpose(1, 0, 2), 1 / np.sqrt(head_dim), causal(new_tokens, 0))
    return float(np.abs(out - expected).max())


def test_webgpu_paged_attention_needs_prefill_chunks_of_31(webgpu, tmp_path):
    """Why ortinf/providers/webgpu.py caps the contrib kernel at 31 new tokens per sequence: a lone
    PagedAttention node is right up to 31 and wrong from 32 (onnxruntime-ep-webgpu 0.4.0). When this
    test fails on the second assert, the plugin was fixed: lift the cap."""
    f16, i32 = TensorProto.FLOAT16, TensorProto.INT32
    node = helper.make_node("PagedAttention", ["q", "k", "v", "kc", "vc", "cu", "past", "bt"], ["o", "kco", "vco"],
                            domain="com.microsoft", num_heads=4, kv_num_heads=2, scale=0.25)
    inputs = [helper.make_tensor_value_info(n, f16, ["T", w]) for n, w in (("q", 64), ("k", 32), ("v", 32))]
    inputs += [helper.make_tensor_value_info(n, f16, [4, 16, 2, 16]) for n in ("kc", "vc")]
    inputs += [helper.make_tensor_value_info(n, i32, shape) for n, shape in (("cu", [2]), ("past", [1]), ("bt", [1, 3]))]
    outputs = [helper.make_tensor_value_info(n, f16, None) for n in ("o", "kco", "vco")]
    model = helper.make_model(helper.make_graph([node], "pa", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(tmp_path / "pa.onnx"))
    session, _ = create_session(tmp_path / "pa.onnx", webgpu)
    assert paged_attention_error(session, 31) < 5e-3
    assert paged_attention_error(session, 32) > 5e-2


@pytest.mark.slow  # 100 s on 2 cores (Mesa's software Vulkan): in the slow run, with the other long checks
def test_whisper_on_webgpu(webgpu, tmp_path):
    """Speech on a device pool: the encoder graph writes each window's cross K/V into its blocks on the
    device (encoder.pool-write.onnx), the decoder reads them there; greedy tokens equal the CPU's, for
    windows decoded side by side and window after window with word timing (the host encoder's cross K/V)."""
    import json

    from support.tiny_models import build_whisper

    from ortinf.tasks.speech.longform import Decoding
    from ortinf.tasks.speech.transcriber import Transcriber

    model = build_whisper(tmp_path / "hf", max_target_positions=32)
    model.generation_config.no_timestamps_token_id = 200
    model.generation_config.save_pretrained(tmp_path / "hf")
    ortinf.export(tmp_path / "hf", tmp_path / "pkg", progress=False)
    assert json.loads((tmp_path / "pkg" / "generation_config.json").read_text())["no_timestamps_token_id"] == 200
    rng = np.random.default_rng(3)
    audios = [(0.3 * rng.standard_normal(16000 * seconds)).astype(np.float32) for seconds in (3, 35)]
    results = {}
    for provider in ("cpu", "webgpu"):
        # a device pool is sized by the caller (the engine's rule): two windows of 94 cross + 2 self blocks
        transcriber = Transcriber(tmp_path / "pkg", max_num_seqs=2, provider=provider, num_blocks=2 * 96)
        assert transcriber.engine.runner.encoder.device_pool == (provider == "webgpu")
        side_by_side = transcriber.transcribe_ids(audios, max_new_tokens=8)
        [timed] = transcriber.run(audios[1:], Decoding(max_new_tokens=8, timestamps=True, word_timestamps=True))
        results[provider] = side_by_side, [(s.start, s.tokens) for s in timed.segments], timed.timings
    assert results["webgpu"][0] == results["cpu"][0] and all(len(t) == 8 for t in results["cpu"][0][:1])
    assert results["webgpu"][1] == results["cpu"][1]
    cpu_times = [t for _, times in results["cpu"][2].values() for t in times]
    gpu_times = [t for _, times in results["webgpu"][2].values() for t in times]
    assert np.allclose(cpu_times, gpu_times, atol=0.021)  # one 20 ms frame at most, from float differences in DTW ties


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl"])
def test_a_vision_language_package_on_webgpu(webgpu, tmp_path, family):
    """issue 33: LLaVA's and Qwen2.5-VL's vision graphs and decoders (the image embeddings merged in the graph;
    Qwen's M-RoPE deltas) on WebGPU: the same greedy tokens as on the CPU (which tests/runtime/worker/test_vision.py and
    test_qwen_vl.py hold equal to transformers)."""
    Image = pytest.importorskip("PIL.Image")
    from support.tiny_models import QWEN_VL_TOKENS, add_tokenizer, build_llava, build_qwen_vl

    (tmp_path / "hf").mkdir()
    add_tokenizer(tmp_path / "hf", 290)
    if family == "llava":
        build_llava(tmp_path / "hf")
        image = [299]
    else:
        build_qwen_vl(tmp_path / "hf", family)
        image = [QWEN_VL_TOKENS["vision_start_token_id"], QWEN_VL_TOKENS["image_token_id"], QWEN_VL_TOKENS["vision_end_token_id"]]
    ortinf.export(tmp_path / "hf", tmp_path / "pkg", progress=False)
    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for shape in ((40, 60, 3), (28, 28, 3))]
    prompts = [{"prompt_token_ids": [5, 7, *image, 9, 11], "multi_modal_data": {"image": pictures[0]}}, [5, 8, 9, 30, 31],
               {"prompt_token_ids": [5, *image, 12, *image, 40], "multi_modal_data": {"image": pictures}}]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in LLM(tmp_path / "pkg", provider="cpu").generate(prompts, greedy)]
    llm = LLM(tmp_path / "pkg", provider="webgpu", num_blocks=64)
    assert llm.engine.graph.pool.values[0].device_name() == "webgpu"
    assert llm.engine.runner.vision.session.get_providers()[0] == "WebGpuExecutionProvider"
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == expected
