"""ortinf.PagedAttention (ortinf/kernels/cpu/) against a numpy reference, in a one-node ONNX graph under the
pinned onnxruntime: random shuffled block tables with shared prefix blocks, ragged contexts,
GQA groups, head dims, sliding windows, soft-capping, fp16 pools and multi-token (chunked prefill)
queries. The worst absolute error of every case is printed (pytest -s) and bounded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builds import rerun_under
from onnx import TensorProto, helper
from support.attention import attend, causal

from ortinf.kernels import library

pytestmark = pytest.mark.skipif(library.load() is None, reason="the kernel library is not built (python -m ortinf.kernels.build)")

INPUTS = ("query", "key", "value", "key_cache", "value_cache", "block_tables", "context_lens", "query_lens")


def op_session(num_heads: int, kv_heads: int, scale: float, window: int, softcap: float, half: bool,
               threads: int = 2) -> ort.InferenceSession:
    cache_type = TensorProto.FLOAT16 if half else TensorProto.FLOAT
    types = [TensorProto.FLOAT] * 3 + [cache_type] * 2 + [TensorProto.INT64] * 3
    ranks = [2, 2, 2, 4, 4, 2, 1, 1]
    inputs = [helper.make_tensor_value_info(n, t, [None] * r) for n, t, r in zip(INPUTS, types, ranks)]
    node = helper.make_node("PagedAttention", list(INPUTS), ["out"], domain="ortinf", num_heads=num_heads,
                            kv_num_heads=kv_heads, scale=scale, sliding_window=window, softcap=softcap)
    graph = helper.make_graph([node], "op", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def reference(q, k, v, key_cache, value_cache, tables, ctx, qlens, num_heads, kv_heads, scale, window, softcap, sinks=None):
    """Dense attention per sequence over [pool slots | new tokens], in float64; `sinks` [H]: one more
    logit per head in the softmax, with no value (gpt-oss)."""
    dim = key_cache.shape[3]
    out = np.zeros((q.shape[0], num_heads, dim))
    start = 0
    for s, (c, n) in enumerate(zip(ctx, qlens)):
        slots = np.arange(c)
        blocks = tables[s, slots // key_cache.shape[2]]
        past_k = key_cache[:, blocks, slots % key_cache.shape[2]].astype(np.float64)  # [KVH, c, D]
        past_v = value_cache[:, blocks, slots % key_cache.shape[2]].astype(np.float64)
        # a half pool: the step's own K/V are read as the pool will hold them (exact chunked prefill)
        step_k, step_v = (k, v) if key_cache.dtype != np.float16 else (k.astype(np.float16), v.astype(np.float16))
        new_k = step_k[start:start + n].reshape(n, kv_heads, dim).transpose(1, 0, 2).astype(np.float64)
        new_v = step_v[start:start + n].reshape(n, kv_heads, dim).transpose(1, 0, 2).astype(np.float64)
        keys, values = np.concatenate([past_k, new_k], 1), np.concatenate([past_v, new_v], 1)
        queries = q[start:start + n].reshape(n, num_heads, dim)
        out[start:start + n] = attend(queries, keys, values, scale, causal(n, c, window), softcap, sinks)
        start += n
    return out.reshape(q.shape[0], -1)


def random_case(rng, contexts, query_lens, num_heads, kv_heads, dim, block_size=16, half=False, shared_prefix=0):
    """Shuffled blocks over a pool with room to spare; the first `shared_prefix` blocks of every
    sequence are the same blocks (a prefix-cache hit)."""
    max_blocks = max(-(-c // block_size) for c in contexts) or 1
    pool_blocks = len(contexts) * max_blocks + 7
    order = rng.permutation(pool_blocks)
    tables = order[: len(contexts) * max_blocks].reshape(len(contexts), max_blocks).copy()
    tables[:, :shared_prefix] = tables[0, :shared_prefix]
    dtype = np.float16 if half else np.float32
    key_cache = rng.standard_normal((kv_heads, pool_blocks, block_size, dim)).astype(dtype)
    value_cache = rng.standard_normal((kv_heads, pool_blocks, block_size, dim)).astype(dtype)
    tokens = sum(query_lens)
    q = rng.standard_normal((tokens, num_heads * dim)).astype(np.float32)
    k = rng.standard_normal((tokens, kv_heads * dim)).astype(np.float32)
    v = rng.standard_normal((tokens, kv_heads * dim)).astype(np.float32)
    return (q, k, v, key_cache, value_cache, tables.astype(np.int64), np.array(contexts, np.int64),
            np.array(query_lens, np.int64))


CASES = [
    # (name, contexts, query_lens, heads, kv_heads, head_dim, window, softcap, half)
    ("decode ragged 1..2000, GQA 2, dim 64", [1, 17, 150, 333, 1024, 2000], [1] * 6, 8, 4, 64, 0, 0.0, False),
    ("decode MHA, dim 80", [5, 64, 190], [1] * 3, 4, 4, 80, 0, 0.0, False),
    ("decode GQA 4, dim 128", [300, 7], [1, 1], 8, 2, 128, 0, 0.0, False),
    ("decode GQA 8 (MQA), dim 64", [100, 250, 31], [1] * 3, 8, 1, 64, 0, 0.0, False),
    ("chunked prefill and prefix hits, mixed with decodes", [0, 48, 200, 33], [37, 40, 1, 3], 8, 4, 64, 0, 0.0, False),
    ("prefill from empty, 70 tokens (tiles of 16)", [0], [70], 4, 2, 64, 0, 0.0, False),
    ("sliding window 32", [0, 100, 500], [50, 5, 1], 8, 4, 64, 32, 0.0, False),
    ("soft-capping 50 (Gemma 2)", [60, 0], [1, 20], 4, 2, 64, 0, 50.0, False),
    ("window and softcap together", [90, 10], [4, 30], 4, 2, 80, 24, 30.0, False),
    ("fp16 pool", [150, 1000, 3], [1, 1, 12], 8, 4, 64, 0, 0.0, True),
    ("fp16 pool, dim 128, GQA 8", [400, 16], [2, 1], 16, 2, 128, 0, 0.0, True),
    ("dim 40 (run-time loops), prefill and decode", [0, 77], [21, 1], 4, 2, 40, 0, 0.0, False),
    ("dim 256, window and fp16", [300, 0], [1, 18], 4, 1, 256, 64, 0.0, True),
]


@pytest.mark.parametrize("name,contexts,query_lens,heads,kv_heads,dim,window,softcap,half", CASES, ids=[c[0] for c in CASES])
def test_matches_numpy(name, contexts, query_lens, heads, kv_heads, dim, window, softcap, half):
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    scale = dim**-0.5
    case = random_case(rng, contexts, query_lens, heads, kv_heads, dim, half=half, shared_prefix=1)
    session = op_session(heads, kv_heads, scale, window, softcap, half)
    got = session.run(None, dict(zip(INPUTS, case)))[0]
    want = reference(*case, heads, kv_heads, scale, window, softcap)
    error = float(np.abs(got - want).max())
    print(f"{name}: max abs error {error:.2e}")
    assert got.shape == want.shape and error < 2e-5


def test_block_size_one_and_unaligned_window():
    """Block size 1 (every key its own block) and a window that starts mid-block."""
    rng = np.random.default_rng(7)
    for block_size, window in ((1, 0), (4, 7)):
        case = random_case(rng, [13, 40], [3, 1], 4, 2, 64, block_size=block_size)
        got = op_session(4, 2, 0.125, window, 0.0, False).run(None, dict(zip(INPUTS, case)))[0]
        assert np.abs(got - reference(*case, 4, 2, 0.125, window, 0.0)).max() < 2e-5


def test_one_thread_equals_two():
    """The jobs write disjoint rows: the thread count changes nothing, bit for bit."""
    case = random_case(np.random.default_rng(3), [100, 7, 260], [1, 9, 1], 8, 4, 64)
    feeds = dict(zip(INPUTS, case))
    one = op_session(8, 4, 0.125, 0, 0.0, False, threads=1).run(None, feeds)[0]
    two = op_session(8, 4, 0.125, 0, 0.0, False, threads=2).run(None, feeds)[0]
    assert np.array_equal(one, two)


@pytest.mark.parametrize("change,message", [
    (lambda c: c.__setitem__(5, np.full_like(c[5], 999)), "outside the pool"),
    (lambda c: c.__setitem__(6, c[6] + 10_000), "longer than its block table"),
    (lambda c: c.__setitem__(7, c[7] + 1), "do not add up"),
    (lambda c: (c.__setitem__(1, c[1][:, :64]), c.__setitem__(2, c[2][:, :64])), "shapes disagree"),
    (lambda c: c.__setitem__(4, c[4][:, :3]), "the same for K and V"),
])
def test_bad_inputs_are_errors_not_reads(change, message):
    case = list(random_case(np.random.default_rng(5), [20, 40], [1, 2], 4, 2, 64))
    change(case)
    with pytest.raises(Exception, match=message):
        op_session(4, 2, 0.125, 0, 0.0, False).run(None, dict(zip(INPUTS, case)))


def rope_session(num_heads: int, kv_heads: int, scale: float, outputs: int = 2) -> ort.InferenceSession:
    """The op with its optional cos/sin inputs (RoPE in the op) and the rotated-key output."""
    names = [*INPUTS, "cos", "sin"]
    types = [TensorProto.FLOAT] * 5 + [TensorProto.INT64] * 3 + [TensorProto.FLOAT] * 2
    ranks = [2, 2, 2, 4, 4, 2, 1, 1, 2, 2]
    inputs = [helper.make_tensor_value_info(n, t, [None] * r) for n, t, r in zip(names, types, ranks)]
    out_names = ["out", "rotated_key"][:outputs]
    node = helper.make_node("PagedAttention", names, out_names, domain="ortinf", num_heads=num_heads,
                            kv_num_heads=kv_heads, scale=scale)
    graph = helper.make_graph([node], "op", inputs, [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, None]) for n in out_names])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
    options = ort.SessionOptions()
    library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, heads: int) -> np.ndarray:
    """transformers' apply_rotary_pos_emb on the first cos.shape[1] dims of each head (float64)."""
    tokens, width = x.shape
    x = x.reshape(tokens, heads, width // heads).astype(np.float64)
    rot = cos.shape[1]
    part, rest = x[..., :rot], x[..., rot:]
    half = np.concatenate([-part[..., rot // 2:], part[..., : rot // 2]], -1)
    out = np.concatenate([part * cos[:, None] + half * sin[:, None], rest], -1)
    return out.reshape(tokens, width)


@pytest.mark.parametrize("rotary_dim", [64, 32], ids=["full", "partial (Phi-3)"])
def test_rope_in_the_op(rotary_dim):
    """With cos/sin the op rotates the queries and the step's keys itself (and returns the rotated
    keys): the same as attention over pre-rotated inputs."""
    rng = np.random.default_rng(rotary_dim)
    case = list(random_case(rng, [0, 60, 130], [20, 1, 3], 8, 4, 64, shared_prefix=1))
    positions = np.concatenate([c + np.arange(n) for c, n in zip(case[6], case[7])])
    angles = positions[:, None] * (10000.0 ** (-np.arange(0, rotary_dim, 2) / rotary_dim))[None]
    cos = np.cos(np.concatenate([angles, angles], 1)).astype(np.float32)
    sin = np.sin(np.concatenate([angles, angles], 1)).astype(np.float32)
    out, rotated = rope_session(8, 4, 0.125).run(None, dict(zip([*INPUTS, "cos", "sin"], [*case, cos, sin])))
    want_keys = rotate(case[1], cos, sin, 4)
    assert np.abs(rotated - want_keys).max() < 1e-5
    rotated_case = [rotate(case[0], cos, sin, 8).astype(np.float32), want_keys.astype(np.float32), *case[2:]]
    want = reference(*rotated_case, 8, 4, 0.125, 0, 0.0)
    error = float(np.abs(out - want).max())
    print(f"rope {rotary_dim}: max abs error {error:.2e}")
    assert error < 2e-5
    # without the second output the op rotates into scratch and gives the same attention
    alone = rope_session(8, 4, 0.125, outputs=1).run(None, dict(zip([*INPUTS, "cos", "sin"], [*case, cos, sin])))[0]
    assert np.array_equal(alone, out)
    with pytest.raises(Exception, match="rotary_dim must be even"):
        rope_session(8, 4, 0.125).run(None, dict(zip([*INPUTS, "cos", "sin"], [*case, cos[:, :3], sin[:, :3]])))


def test_attention_sinks():
    """gpt-oss's sinks (input 10, cos/sin omitted): each head's softmax has one more logit, with no value."""
    rng = np.random.default_rng(7)
    case = random_case(rng, [0, 19, 40], [5, 1, 3], 8, 4, 64)
    sinks = rng.normal(0, 2, 8).astype(np.float32)
    names = [*INPUTS, "", "", "sinks"]
    types = [TensorProto.FLOAT] * 5 + [TensorProto.INT64] * 3
    inputs = [helper.make_tensor_value_info(n, t, [None] * r) for n, t, r in zip(INPUTS, types, [2, 2, 2, 4, 4, 2, 1, 1])]
    inputs.append(helper.make_tensor_value_info("sinks", TensorProto.FLOAT, [8]))
    node = helper.make_node("PagedAttention", names, ["out"], domain="ortinf", num_heads=8, kv_num_heads=4, scale=0.125, sliding_window=16)
    graph = helper.make_graph([node], "op", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, None])])
    options = ort.SessionOptions()
    library.register(options)
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)]
                                                     ).SerializeToString(), options, providers=["CPUExecutionProvider"])
    out = session.run(None, {**dict(zip(INPUTS, case)), "sinks": sinks})[0]
    want = reference(*case, 8, 4, 0.125, 16, 0.0, sinks=sinks.astype(np.float64))
    assert np.abs(out - want).max() < 1e-4
    assert np.abs(out - reference(*case, 8, 4, 0.125, 16, 0.0)).max() > 1e-2  # the sinks change the output
    with pytest.raises(Exception, match="sinks"):  # ORT checks the declared shape first
        session.run(None, {**dict(zip(INPUTS, case)), "sinks": sinks[:4]})


def test_cross_attention_mode():
    """cross=1 (Whisper): every query of a sequence, prefill rows included, sees exactly its cached keys
    0 .. context_len - 1 (the encoder's K/V in its cross blocks), no causal cut, not the step's keys."""
    rng = np.random.default_rng(7)
    heads, dim, contexts, query_lens = 6, 64, [1500, 1500, 700], [4, 1, 20]
    q, k, v, key_cache, value_cache, tables, ctx, qlens = random_case(rng, contexts, query_lens, heads, heads, dim)
    cache_type = TensorProto.FLOAT
    types = [TensorProto.FLOAT] * 3 + [cache_type] * 2 + [TensorProto.INT64] * 3
    inputs = [helper.make_tensor_value_info(n, t, [None] * r) for n, t, r in zip(INPUTS, types, [2, 2, 2, 4, 4, 2, 1, 1])]
    node = helper.make_node("PagedAttention", list(INPUTS), ["out"], domain="ortinf", num_heads=heads, kv_num_heads=heads,
                            scale=dim**-0.5, cross=1)
    graph = helper.make_graph([node], "op", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
    options = ort.SessionOptions()
    library.register(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    got = session.run(None, dict(zip(INPUTS, (q, k, v, key_cache, value_cache, tables, ctx, qlens))))[0]
    want = np.zeros((q.shape[0], heads, dim))
    start = 0
    for s, (c, n) in enumerate(zip(contexts, query_lens)):  # no mask: every cached key, none of the step's
        slots = np.arange(c)
        blocks = tables[s, slots // 16]
        keys, values = key_cache[:, blocks, slots % 16], value_cache[:, blocks, slots % 16]
        want[start:start + n] = attend(q[start:start + n].reshape(n, heads, dim), keys, values, dim**-0.5)
        start += n
    assert np.abs(got - want.reshape(q.shape[0], -1)).max() < 2e-5


def quantize_rows(x: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The int8 pool's rows of x [n, dim] float32 (D int8 values, then the float scale's 4 bytes) and the
    floats they stand for, computed as the op does: scale = max|x| / 127, q = rint(x * 127 / max|x|)."""
    x = x.reshape(-1, dim).astype(np.float32)
    top = np.abs(x).max(1)
    scale = (top / np.float32(127)).astype(np.float32)
    inverse = np.where(top > 0, np.float32(127) / np.where(top > 0, top, 1), 0).astype(np.float32)
    q = np.clip(np.rint(x * inverse[:, None]), -127, 127).astype(np.int8)
    rows = np.concatenate([q, scale.view(np.int8).reshape(-1, 4)], 1)
    return rows, q.astype(np.float32) * scale[:, None]


def int8_session(num_heads: int, kv_heads: int, scale: float, window: int = 0, pool: int = TensorProto.INT8) -> ort.InferenceSession:
    types = [TensorProto.FLOAT] * 3 + [pool] * 2 + [TensorProto.INT64] * 3
    inputs = [helper.make_tensor_value_info(n, t, [None] * r) for n, t, r in zip(INPUTS, types, [2, 2, 2, 4, 4, 2, 1, 1])]
    outs = [("out", TensorProto.FLOAT), ("rotated_key", TensorProto.FLOAT), ("key_rows", TensorProto.INT8),
            ("value_rows", TensorProto.INT8)]
    node = helper.make_node("PagedAttention", list(INPUTS), [n for n, _ in outs], domain="ortinf", num_heads=num_heads,
                            kv_num_heads=kv_heads, scale=scale, sliding_window=window)
    graph = helper.make_graph([node], "op", inputs, [helper.make_tensor_value_info(n, t, [None, None]) for n, t in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
    options = ort.SessionOptions()
    library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("contexts,query_lens,heads,kv_heads,dim,window", [
    ([1, 150, 1000], [1, 1, 1], 8, 2, 64, 0),
    ([0, 48, 200], [37, 3, 1], 8, 4, 128, 0),
    ([0, 300], [18, 1], 4, 1, 40, 64),
], ids=["decode GQA 4, dim 64", "chunked prefill, dim 128", "dim 40, window 64"])
def test_int8_pool(contexts, query_lens, heads, kv_heads, dim, window):
    """An int8 pool (rows of int8 values and their float scale, per token per head): the op reads it in
    place, returns the step's K/V quantized as the pool holds them (bit for bit numpy's rows), and
    attends over the step's own keys as those rows read back (chunked prefill then equals unchunked)."""
    rng = np.random.default_rng(dim)
    q, k, v, key_f, value_f, tables, ctx, qlens = random_case(rng, contexts, query_lens, heads, kv_heads, dim, shared_prefix=1)
    key_rows, key_read = quantize_rows(key_f, dim)
    value_rows, value_read = quantize_rows(value_f, dim)
    pool_shape = (*key_f.shape[:3], dim + 4)
    feeds = dict(zip(INPUTS, (q, k, v, key_rows.reshape(pool_shape), value_rows.reshape(pool_shape), tables, ctx, qlens)))
    out, rotated, new_key_rows, new_value_rows = int8_session(heads, kv_heads, dim**-0.5, window).run(None, feeds)
    want_k, step_k = quantize_rows(k, dim)
    want_v, step_v = quantize_rows(v, dim)
    assert np.array_equal(rotated, k)  # no cos/sin: the keys as given
    assert np.array_equal(new_key_rows, want_k.reshape(len(k), -1)) and np.array_equal(new_value_rows, want_v.reshape(len(v), -1))
    want = reference(q, step_k.reshape(k.shape), step_v.reshape(v.shape), key_read.reshape(key_f.shape),
                     value_read.reshape(value_f.shape), tables, ctx, qlens, heads, kv_heads, dim**-0.5, window, 0.0)
    error = float(np.abs(out - want).max())
    print(f"int8 pool dim {dim}: max abs error {error:.2e} against attention over the dequantized rows")
    assert error < 2e-5
    exact = reference(q, k, v, key_f, value_f, tables, ctx, qlens, heads, kv_heads, dim**-0.5, window, 0.0)
    print(f"int8 pool dim {dim}: max abs error {np.abs(out - exact).max():.2e} against the float K/V (the rounding)")
    assert np.abs(out - exact).max() < 0.05


def test_int8_pool_refusals():
    case = list(random_case(np.random.default_rng(5), [20], [1], 4, 2, 64))
    rows = quantize_rows(case[3], 64)[0].reshape(*case[3].shape[:3], 68)
    with pytest.raises(Exception, match="the same for K and V"):  # rows without their scale bytes
        int8_session(4, 2, 0.125).run(None, dict(zip(INPUTS, [*case[:3], rows, rows[..., :64].copy(), *case[5:]])))
    with pytest.raises(Exception, match="shapes disagree"):  # a float pool's width read as int8 rows: head_dim 60
        int8_session(4, 2, 0.125).run(None, dict(zip(INPUTS, [*case[:3], rows[..., :64].copy(), rows[..., :64].copy(), *case[5:]])))
    with pytest.raises(Exception, match="key_rows and value_rows outputs need an int8 pool"):
        int8_session(4, 2, 0.125, pool=TensorProto.FLOAT).run(None, dict(zip(INPUTS, case)))


def write_session(kv_heads: int, pool: int, rank: int = 2) -> ort.InferenceSession:
    """The op writing the pool itself: slot_mapping (input 12) and the pool outputs 4 and 5, the others left out;
    q/k/v of `rank` (3: [1, T, width], as the projections give them)."""
    types = [TensorProto.FLOAT] * 3 + [pool] * 2 + [TensorProto.INT64] * 3
    inputs = [helper.make_tensor_value_info(n, t, [None] * r) for n, t, r in zip(INPUTS, types, [rank] * 3 + [4, 4, 2, 1, 1])]
    inputs.append(helper.make_tensor_value_info("slot_mapping", TensorProto.INT64, [None]))
    node = helper.make_node("PagedAttention", [*INPUTS, "", "", "", "", "slot_mapping"], ["out", "", "", "", "key_out", "value_out"],
                            domain="ortinf", num_heads=8, kv_num_heads=kv_heads, scale=0.125)
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None, None])]
    outputs += [helper.make_tensor_value_info(n, pool, [None] * 4) for n in ("key_out", "value_out")]
    graph = helper.make_graph([node], "op", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ortinf", 1)])
    options = ort.SessionOptions()
    library.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("kind", ["float32", "float16", "int8"])
def test_the_op_writes_the_pool_in_place(kind):
    """With slot_mapping and the pool outputs, the op writes the step's K and V at their slots: the same bytes the
    graph's Cast + Transpose + ScatterND wrote (float16 rounded to nearest even, as numpy and ORT's Cast round; the
    int8 pool's rows as test_int8_pool checks them), in place when the outputs are bound to the pool's own buffers,
    into a copy of the pool otherwise; the attention is the op's without the write, and q/k/v may come [1, T, width]."""
    rng = np.random.default_rng(7)
    dim, kv_heads = 64, 2
    q, k, v, key_f, value_f, tables, ctx, qlens = random_case(rng, [0, 40, 100], [20, 1, 3], 8, kv_heads, dim, shared_prefix=1)
    pool_type = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int8": TensorProto.INT8}[kind]
    if kind == "int8":
        key_pool, value_pool = (quantize_rows(x, dim)[0].reshape(*x.shape[:3], dim + 4) for x in (key_f, value_f))
        rows = [quantize_rows(x, dim)[0].reshape(len(x), kv_heads, dim + 4) for x in (k, v)]
    else:
        dtype = np.float16 if kind == "float16" else np.float32
        key_pool, value_pool = key_f.astype(dtype), value_f.astype(dtype)
        rows = [x.reshape(len(x), kv_heads, dim).astype(dtype) for x in (k, v)]
    blocks, block_size = key_pool.shape[1], key_pool.shape[2]
    free = np.setdiff1d(np.arange(blocks * block_size), (tables[:, :, None] * block_size + np.arange(block_size)).ravel())
    slots = rng.choice(free, len(q), replace=False).astype(np.int64)
    want_pools = [key_pool.copy(), value_pool.copy()]
    for pool, new in zip(want_pools, rows):
        pool.reshape(kv_heads, blocks * block_size, -1)[:, slots] = new.swapaxes(0, 1)
    feeds = dict(zip(INPUTS, (q, k, v, key_pool, value_pool, tables, ctx, qlens)))
    plain = write_session(kv_heads, pool_type).run(None, {**feeds, "slot_mapping": slots})  # outputs: fresh buffers
    assert np.array_equal(plain[1], want_pools[0]) and np.array_equal(plain[2], want_pools[1])
    assert np.array_equal(key_pool, feeds["key_cache"])  # the input pool untouched when the outputs are elsewhere
    session = write_session(kv_heads, pool_type, rank=3)
    binding = session.io_binding()
    pools = [ort.OrtValue.ortvalue_from_numpy(key_pool), ort.OrtValue.ortvalue_from_numpy(value_pool)]
    for name, value in {**feeds, "slot_mapping": slots, "query": q[None], "key": k[None], "value": v[None]}.items():
        if name in ("key_cache", "value_cache"):
            continue
        binding.bind_cpu_input(name, np.ascontiguousarray(value))
    binding.bind_ortvalue_input("key_cache", pools[0])
    binding.bind_ortvalue_input("value_cache", pools[1])
    binding.bind_output("out", "cpu")  # first bound: get_outputs()[0]
    binding.bind_ortvalue_output("key_out", pools[0])
    binding.bind_ortvalue_output("value_out", pools[1])
    session.run_with_iobinding(binding)
    assert np.array_equal(key_pool, want_pools[0]) and np.array_equal(value_pool, want_pools[1])  # in place
    assert np.array_equal(binding.get_outputs()[0].numpy(), plain[0])
    with pytest.raises(Exception, match="a slot lies outside the pool"):
        write_session(kv_heads, pool_type).run(None, {**feeds, "slot_mapping": np.full(len(q), blocks * block_size, np.int64)})


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_every_build_the_machine_runs(isa):
    """The op tests again under the narrower builds this CPU can run."""
    if isa == "avx2" and "avx2" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX2")
    rerun_under(isa, __file__, "library.load().isa")
