// ortinf.PagedAttention: attention over the paged KV pool, for ONNX Runtime's CPU provider (registered with the
// library's other ops in register.cc, which also says why the library is written against ORT's C API only).
//
// The op, per layer (inputs, then attributes):
//   query [T, H*D] f32, key [T, KVH*D] f32, value [T, KVH*D] f32   this step's tokens (or with leading dims
//     whose product is T: [1, T, H*D] as the projections give them)
//   key_cache, value_cache [KVH, blocks, block_size, D] f32 or f16,  the paged pool, read in place
//     or [KVH, blocks, block_size, D + 4] int8 (rows of D int8 values and their float scale; attention_impl.h)
//   block_tables [S, max_blocks] i64, context_lens [S] i64, query_lens [S] i64
//   cos, sin [T, R] f32 (optional, both or neither)                  RoPE of each token, R <= D, even
//   sinks [H] f32 (optional)                                         gpt-oss's attention sinks per head
//   attend_until [T] i64 (optional)                                  the last position each token sees, from
//     its own up to the step's last (Gemma 3's image tokens see their whole image at prefill)
//   num_heads, kv_num_heads (int), scale (float), sliding_window (int, 0 none), softcap (float, 0 none),
//   cross (int, 0 none): cross-attention, each query over exactly the cached keys (Whisper's encoder
//   K/V in the sequence's cross blocks; key and value are then ignored)
//   slot_mapping [T] i64 (optional, input 12): each token's pool slot, for the write below
//   -> output [T, H*D] f32, and (optional) rotated_key [T, KVH*D] f32 (the step's keys, rotated when cos/sin
//      are given), key_rows and value_rows [T, KVH*(D + 4)] int8 (an int8 pool only: the step's K and V
//      quantized as the pool holds them, for the graph's KV write), key_cache_out and value_cache_out (optional,
//      outputs 4 and 5, both or neither, with slot_mapping): the pools with the step's K and V written at their slots
// Without cos/sin, query and key come rotated already (graphs exported before RoPE moved here).
// With them the op rotates the query rows as it loads them and the step's keys once, and returns
// the rotated keys for the pool: the graph then has no RoPE nodes (14 elementwise nodes and a
// shape chain per layer; the graph's node count, not its arithmetic, is what a one-sequence decode
// step pays for). With outputs 4 and 5 the op writes the step's K and V into the pool itself: the runtime binds
// them to the very buffers it binds as the pool inputs, so the write is in place (a copy of the whole pool first if
// they are other buffers); the exporter's CPU graph does this instead of a Reshape, Cast, Transpose and ScatterND per
// tensor (ortinf/exporter/cpu_fusion.py, rewrite 6). Without them the graph's ScatterND writes the pool
// (ortinf/exporter/kv_write.py). Either way the jobs read the step's own K/V from the key/value inputs, never from
// the pool, so they never depend on whether the write ran first.
//
// Threads: the jobs (sequence x KV head x query tile) run on ORT's own intra-op pool through
// KernelContext_ParallelFor, which hands them out one at a time (jobs differ in cost: contexts are
// ragged), never on a second pool that would fight ORT's threads for the cores.

#include <onnxruntime_c_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attention_impl.h"
#include "ort_glue.h"

namespace {

using ortinf::g_api;
using ortinf::fail;
using ortinf::Tensor;
using ortinf::read_input;
using ortinf::attr_int;
using ortinf::attr_float;

using JobFn = void (*)(const ortinf::Step&, const ortinf::Job&);
using RoundFn = void (*)(const float*, float*, int64_t);

// The widest build this CPU runs (the AVX-512 build needs F, BW, VL, DQ: what -mavx512{f,bw,vl,dq}
// let the compiler use, and F16C/FMA for the half pool and the multiply-adds). ORTINF_KERNEL_ISA=avx2
// or generic caps it (never raises it): the tests run every build the machine can, so an AVX-512
// machine checks the code an AVX2-only one runs.
JobFn pick_job(const char** isa) {
  const char* cap = std::getenv("ORTINF_KERNEL_ISA");
  const bool no512 = cap != nullptr && (std::strcmp(cap, "avx2") == 0 || std::strcmp(cap, "generic") == 0);
  const bool no256 = cap != nullptr && std::strcmp(cap, "generic") == 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (!no512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
    *isa = "avx512";
    return ortinf::run_job_avx512;
  }
  if (!no256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    *isa = "avx2";
    return ortinf::run_job_avx2;
  }
#endif
  *isa = "generic";
  return ortinf::run_job_generic;
}

const char* g_isa = "";
const JobFn g_run_job = pick_job(&g_isa);
const RoundFn g_round_half = std::strcmp(g_isa, "avx512") == 0 ? ortinf::round_half_avx512
                             : std::strcmp(g_isa, "avx2") == 0 ? ortinf::round_half_avx2 : ortinf::round_half_generic;

struct Kernel {
  int64_t num_heads = 0, kv_heads = 0, sliding_window = 0, cross = 0;
  float scale = 0.f, softcap = 0.f;
};

struct Call {
  ortinf::Step step;
  std::vector<ortinf::Job> jobs;
};

void run_one(void* data, size_t index) {
  const Call* call = static_cast<const Call*>(data);
  g_run_job(call->step, call->jobs[index]);
}

constexpr size_t kInputs = 13, kRequiredInputs = 8;
constexpr size_t kSlotMapping = 12, kKeyCacheOut = 4;  // input 12; outputs 4 and 5

// An optional output's buffer, or null where the node leaves the output out (an empty name).
template <typename T>
OrtStatus* output_data(OrtKernelContext* context, size_t index, int64_t rows, int64_t cols, T** data) {
  OrtValue* value = nullptr;
  const int64_t shape[2] = {rows, cols};
  *data = nullptr;
  RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, index, shape, 2, &value));
  return value == nullptr ? nullptr : g_api->GetTensorMutableData(value, reinterpret_cast<void**>(data));
}

// The int8 pool's rows (attention_impl.h, kInt8) of n rows of `dim` floats. Plain scalar code compiled
// once: the rows are the same bytes whatever build the jobs run.
void quantize_rows(const float* x, int64_t n, int64_t dim, int8_t* rows) {
  for (int64_t r = 0; r < n; ++r) {
    const float* in = x + r * dim;
    int8_t* q = rows + r * (dim + 4);
    float top = 0.f;
    for (int64_t d = 0; d < dim; ++d) top = std::max(top, std::fabs(in[d]));
    const float scale = top / 127.f, inverse = top > 0.f ? 127.f / top : 0.f;
    for (int64_t d = 0; d < dim; ++d) {
      const float v = std::nearbyint(in[d] * inverse);  // to nearest even (the default rounding mode)
      q[d] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, v)));
    }
    std::memcpy(q + dim, &scale, sizeof(scale));
  }
}

// float32 -> IEEE half bits, rounded to nearest even (what ORT's Cast writes; F. Giesen's float_to_half_fast3_rtne)
uint16_t to_half(float value) {
  uint32_t x = 0;
  std::memcpy(&x, &value, sizeof x);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t out = 0;
  if (x >= (127u + 16u) << 23) {
    out = x > 255u << 23 ? 0x7e00 : 0x7c00;  // NaN, or too large: infinity
  } else if (x < 113u << 23) {  // a half subnormal (or zero): let float addition round it
    const uint32_t magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    float magic = 0.f, sum = 0.f;
    std::memcpy(&magic, &magic_bits, sizeof magic);
    std::memcpy(&sum, &x, sizeof sum);
    sum += magic;
    uint32_t bits = 0;
    std::memcpy(&bits, &sum, sizeof bits);
    out = static_cast<uint16_t>(bits - magic_bits);
  } else {
    const uint32_t odd = (x >> 13) & 1u;
    x += ((15u - 127u) << 23) + 0xfffu + odd;
    out = static_cast<uint16_t>(x >> 13);
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

// The step's K (or V) into the pool at each token's slot: `floats` for a float32 or float16 pool (float16: values
// already rounded to half, so converting them is exact), `rows` (dim + 4 bytes each) for an int8 pool. What the
// graph's Cast + Transpose + ScatterND wrote before (ortinf/exporter/cpu_fusion.py, rewrite 6), byte for byte.
void write_pool(ortinf::CacheKind kind, void* pool, const float* floats, const int8_t* rows, const int64_t* slots, int64_t num_tokens,
                int64_t kv_heads, int64_t pool_blocks, int64_t block_size, int64_t dim) {
  const int64_t row = kind == ortinf::kInt8 ? dim + 4 : dim;
  for (int64_t token = 0; token < num_tokens; ++token)
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t at = (h * pool_blocks * block_size + slots[token]) * row, from = (token * kv_heads + h);
      if (kind == ortinf::kFloat) {
        std::memcpy(static_cast<float*>(pool) + at, floats + from * dim, static_cast<size_t>(dim) * sizeof(float));
      } else if (kind == ortinf::kHalf) {
        uint16_t* out = static_cast<uint16_t*>(pool) + at;
        for (int64_t d = 0; d < dim; ++d) out[d] = to_half(floats[from * dim + d]);
      } else {
        std::memcpy(static_cast<int8_t*>(pool) + at, rows + from * row, static_cast<size_t>(row));
      }
    }
}

OrtStatus* compute(const Kernel& k, OrtKernelContext* context) {
  Tensor t[kInputs];
  size_t given = 0;
  RETURN_IF_ERROR(g_api->KernelContext_GetInputCount(context, &given));
  for (size_t i = 0; i < std::min(given, kInputs); ++i) {
    const OrtValue* value = nullptr;
    RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, i, &value));
    if (value == nullptr) {  // an omitted optional input
      if (i < kRequiredInputs) return fail("PagedAttention: a required input is missing");
      continue;
    }
    RETURN_IF_ERROR(read_input(context, i, &t[i]));
  }
  const Tensor &query = t[0], &key = t[1], &value = t[2], &key_cache = t[3], &value_cache = t[4];
  const Tensor &tables = t[5], &context_lens = t[6], &query_lens = t[7];

  for (int i = 0; i < 3; ++i)
    if (t[i].type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return fail("PagedAttention: query, key and value must be float32");
  for (int i = 5; i < 8; ++i)
    if (t[i].type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) return fail("PagedAttention: block_tables, context_lens and query_lens must be int64");
  ortinf::CacheKind kind;
  switch (key_cache.type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: kind = ortinf::kFloat; break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: kind = ortinf::kHalf; break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: kind = ortinf::kInt8; break;
    default: return fail("PagedAttention: the caches must be float32, float16 or int8");
  }
  if (value_cache.type != key_cache.type) return fail("PagedAttention: the K and V caches must have one type");
  if (key_cache.shape.size() != 4 || key_cache.shape != value_cache.shape)
    return fail("PagedAttention: the caches must be [kv_heads, blocks, block_size, head_dim], the same for K and V");
  const int64_t kv_heads = key_cache.shape[0], pool_blocks = key_cache.shape[1], block_size = key_cache.shape[2];
  const int64_t dim = key_cache.shape[3] - (kind == ortinf::kInt8 ? 4 : 0);  // int8 rows end in their scale
  if (kind == ortinf::kInt8 && k.cross) return fail("PagedAttention: cross-attention reads a float32 or float16 pool");
  if (kv_heads != k.kv_heads || k.num_heads % k.kv_heads != 0 || dim <= 0 || dim > ortinf::kMaxHeadDim || block_size <= 0)
    return fail("PagedAttention: the cache shape does not match kv_num_heads, or head_dim is outside 1..512");
  if (query.shape.size() < 2 || key.shape.size() < 2 || value.shape.size() < 2 || tables.shape.size() != 2 ||
      context_lens.shape.size() != 1 || query_lens.shape != context_lens.shape)
    return fail("PagedAttention: wrong input ranks");
  // query, key and value may keep leading dims ([1, T, width] straight from the projections: the CPU graph has no
  // Reshape in front, ortinf/exporter/cpu_fusion.py); their rows are the product of all dims but the last
  const auto rows_of = [](const Tensor& x) {
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < x.shape.size(); ++i) rows *= x.shape[i];
    return rows;
  };
  const int64_t num_tokens = rows_of(query), num_seqs = context_lens.shape[0], max_blocks = tables.shape[1];
  if (query.shape.back() != k.num_heads * dim || rows_of(key) != num_tokens || key.shape.back() != kv_heads * dim ||
      rows_of(value) != num_tokens || value.shape.back() != kv_heads * dim || tables.shape[0] != num_seqs)
    return fail("PagedAttention: query/key/value/block_tables shapes disagree with the heads and sequences");

  Call call;
  ortinf::Step& step = call.step;
  std::vector<int64_t> starts(num_seqs);
  const int64_t* ctx = static_cast<const int64_t*>(context_lens.data);
  const int64_t* qlen = static_cast<const int64_t*>(query_lens.data);
  const int64_t* table = static_cast<const int64_t*>(tables.data);
  int64_t total = 0;
  // Every index the jobs will follow is checked here, once: a bad input is an error, never a stray read.
  for (int64_t s = 0; s < num_seqs; ++s) {
    if (ctx[s] < 0 || qlen[s] < 0 || ctx[s] > max_blocks * block_size)
      return fail("PagedAttention: a context length is negative or longer than its block table");
    for (int64_t b = 0, used = (ctx[s] + block_size - 1) / block_size; b < used; ++b)
      if (table[s * max_blocks + b] < 0 || table[s * max_blocks + b] >= pool_blocks)
        return fail("PagedAttention: a block table entry lies outside the pool");
    starts[s] = total;
    total += qlen[s];
    for (int64_t q0 = 0; q0 < qlen[s]; q0 += ortinf::kQueryTile)
      for (int64_t h = 0; h < kv_heads; ++h) call.jobs.push_back({s, h, q0, std::min(qlen[s], q0 + ortinf::kQueryTile)});
  }
  if (total != num_tokens) return fail("PagedAttention: query_lens do not add up to the number of tokens");
  const Tensor &cos = t[8], &sin = t[9];
  const bool rotate = cos.data != nullptr;
  int64_t rotary_dim = 0;
  if (rotate || sin.data != nullptr) {
    if (!rotate || sin.data == nullptr || cos.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || sin.type != cos.type ||
        cos.shape.size() != 2 || cos.shape != sin.shape || cos.shape[0] != num_tokens)
      return fail("PagedAttention: cos and sin must both be float32 [num_tokens, rotary_dim]");
    rotary_dim = cos.shape[1];
    if (rotary_dim <= 0 || rotary_dim > dim || rotary_dim % 2 != 0)
      return fail("PagedAttention: rotary_dim must be even and in 1..head_dim");
  }

  const Tensor& sinks = t[10];
  if (sinks.data != nullptr && (sinks.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || sinks.shape.size() != 1 ||
                                sinks.shape[0] != k.num_heads))
    return fail("PagedAttention: sinks must be float32 [num_heads]");

  const Tensor& until = t[11];
  const int64_t* until_data = static_cast<const int64_t*>(until.data);
  if (until_data != nullptr) {
    if (until.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 || until.shape.size() != 1 || until.shape[0] != num_tokens)
      return fail("PagedAttention: attend_until must be int64 [num_tokens]");
    for (int64_t s = 0; s < num_seqs; ++s)
      for (int64_t i = 0; i < qlen[s]; ++i) {
        const int64_t last = until_data[starts[s] + i];
        if (last < ctx[s] + i || last >= ctx[s] + qlen[s])
          return fail("PagedAttention: attend_until must lie between a token's own position and its step's last");
      }
  }

  OrtValue* output = nullptr;
  const int64_t out_shape[2] = {num_tokens, k.num_heads * dim};
  RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, out_shape, 2, &output));
  float* out = nullptr;
  RETURN_IF_ERROR(g_api->GetTensorMutableData(output, reinterpret_cast<void**>(&out)));
  size_t outputs = 0;
  RETURN_IF_ERROR(g_api->KernelContext_GetOutputCount(context, &outputs));
  const float* keys = static_cast<const float*>(key.data);
  const int64_t step_floats = num_tokens * kv_heads * dim;
  std::vector<float> rotated_scratch;
  if (rotate || outputs > 1) {  // the step's keys, rotated once: the jobs read them, the pool gets them (output 1)
    float* rotated = nullptr;
    if (outputs > 1) RETURN_IF_ERROR(output_data(context, 1, num_tokens, kv_heads * dim, &rotated));
    if (rotated == nullptr) {
      rotated_scratch.resize(static_cast<size_t>(step_floats));
      rotated = rotated_scratch.data();
    }
    const float* c = static_cast<const float*>(cos.data);
    const float* s = static_cast<const float*>(sin.data);
    if (rotate) {
      for (int64_t token = 0; token < num_tokens; ++token)
        for (int64_t h = 0; h < kv_heads; ++h) {
          const int64_t at = (token * kv_heads + h) * dim;
          ortinf::rope(keys + at, c + token * rotary_dim, s + token * rotary_dim, rotary_dim, dim, 1.f, rotated + at);
        }
    } else {
      std::memcpy(rotated, keys, static_cast<size_t>(step_floats) * sizeof(float));
    }
    keys = rotated;
  }

  const float* values = static_cast<const float*>(value.data);
  // The jobs read the step's own K/V as the pool will hold them: a token then sees the same numbers from
  // the pool or from this step, and chunked prefill equals unchunked. Half: rounded copies; int8: the rows.
  std::vector<float> read_keys, read_values;
  std::vector<int8_t> row_scratch;
  int8_t* rows[2] = {nullptr, nullptr};
  if (kind != ortinf::kFloat && !k.cross) {
    if (kind == ortinf::kHalf) {
      read_keys.resize(static_cast<size_t>(step_floats));
      read_values.resize(static_cast<size_t>(step_floats));
      g_round_half(keys, read_keys.data(), step_floats);
      g_round_half(values, read_values.data(), step_floats);
      keys = read_keys.data();
      values = read_values.data();
    } else {
      const int64_t row = dim + 4, width = kv_heads * row;
      for (int i = 0; i < 2; ++i) {
        if (outputs > 2 + static_cast<size_t>(i)) RETURN_IF_ERROR(output_data(context, 2 + i, num_tokens, width, &rows[i]));
        if (rows[i] == nullptr) {
          row_scratch.resize(static_cast<size_t>(2 * num_tokens * width));
          rows[i] = row_scratch.data() + i * num_tokens * width;
        }
      }
      quantize_rows(keys, num_tokens * kv_heads, dim, rows[0]);
      quantize_rows(values, num_tokens * kv_heads, dim, rows[1]);
    }
  } else {
    for (size_t i = 2; i < std::min<size_t>(outputs, kKeyCacheOut); ++i) {
      int8_t* asked = nullptr;
      RETURN_IF_ERROR(output_data(context, i, num_tokens, kv_heads * (dim + 4), &asked));
      if (asked != nullptr) return fail("PagedAttention: the key_rows and value_rows outputs need an int8 pool");
    }
  }

  if (outputs > kKeyCacheOut) {  // the pool written here, in place (outputs 4, 5 are bound to the pool's own buffers)
    const Tensor& slots = t[kSlotMapping];
    if (k.cross || slots.data == nullptr || slots.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 || slots.shape.size() != 1 ||
        slots.shape[0] != num_tokens || outputs < kKeyCacheOut + 2)
      return fail("PagedAttention: writing the pool needs slot_mapping int64 [num_tokens] and both pool outputs (not with cross)");
    const int64_t* slot = static_cast<const int64_t*>(slots.data);
    for (int64_t token = 0; token < num_tokens; ++token)
      if (slot[token] < 0 || slot[token] >= pool_blocks * block_size) return fail("PagedAttention: a slot lies outside the pool");
    const size_t bytes = static_cast<size_t>(key_cache.size()) * (kind == ortinf::kFloat ? 4 : kind == ortinf::kHalf ? 2 : 1);
    for (int i = 0; i < 2; ++i) {
      OrtValue* pool_out = nullptr;
      const Tensor& pool_in = i == 0 ? key_cache : value_cache;
      RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, kKeyCacheOut + i, pool_in.shape.data(), pool_in.shape.size(), &pool_out));
      void* pool = nullptr;
      RETURN_IF_ERROR(g_api->GetTensorMutableData(pool_out, &pool));
      if (pool != pool_in.data) std::memcpy(pool, pool_in.data, bytes);  // not bound to the pool itself: a copy first
      write_pool(kind, pool, i == 0 ? keys : values, rows[i], slot, num_tokens, kv_heads, pool_blocks, block_size, dim);
    }
  }

  step = {static_cast<const float*>(query.data), keys,
          rotate ? static_cast<const float*>(cos.data) : nullptr, rotate ? static_cast<const float*>(sin.data) : nullptr,
          rotary_dim, values, rows[0], rows[1], key_cache.data, value_cache.data, kind, table, ctx, starts.data(), max_blocks, pool_blocks,
          block_size, k.num_heads, kv_heads, dim, k.scale, k.sliding_window, k.softcap, out,
          static_cast<const float*>(sinks.data), until_data, k.cross != 0};
  if (call.jobs.size() == 1) {
    run_one(&call, 0);
    return nullptr;
  }
  return g_api->KernelContext_ParallelFor(context, run_one, call.jobs.size(), 0, &call);
}

// --- the OrtCustomOp table ---------------------------------------------------------------------

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** kernel) {
  auto* k = new Kernel();
  attr_int(info, "num_heads", 0, &k->num_heads);
  attr_int(info, "kv_num_heads", 0, &k->kv_heads);
  attr_int(info, "sliding_window", 0, &k->sliding_window);
  attr_int(info, "cross", 0, &k->cross);
  attr_float(info, "scale", 0.f, &k->scale);
  attr_float(info, "softcap", 0.f, &k->softcap);
  if (k->num_heads <= 0 || k->kv_heads <= 0 || k->scale <= 0.f) {
    delete k;
    return fail("PagedAttention: num_heads, kv_num_heads and scale attributes are required and positive");
  }
  *kernel = k;
  return nullptr;
}

OrtStatus* ORT_API_CALL kernel_compute(void* kernel, OrtKernelContext* context) {
  return compute(*static_cast<const Kernel*>(kernel), context);
}

void ORT_API_CALL kernel_destroy(void* kernel) { delete static_cast<Kernel*>(kernel); }

const char* ORT_API_CALL op_name(const OrtCustomOp*) { return "PagedAttention"; }
size_t ORT_API_CALL input_count(const OrtCustomOp*) { return kInputs; }
size_t ORT_API_CALL output_count(const OrtCustomOp*) { return 6; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t index) {
  if (index == 11 || index == kSlotMapping) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;  // attend_until, slot_mapping
  if (index < 3 || index >= kRequiredInputs) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  if (index < 5) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // the pool: float or float16, checked in compute
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
}
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp*, size_t index) {
  if (index >= kKeyCacheOut) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // the pool's own type
  return index < 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_required(const OrtCustomOp*, size_t index) {
  return index < kRequiredInputs ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_required(const OrtCustomOp*, size_t index) {
  return index == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}

OrtCustomOp g_paged_attention = ortinf::make_op({op_name, input_type, input_count, output_type, output_count, input_required,
                                         output_required, create_kernel, kernel_compute, kernel_destroy});

}  // namespace

namespace ortinf {
OrtCustomOp* paged_attention_op() { return &g_paged_attention; }
const char* attention_isa() { return g_isa; }
}  // namespace ortinf
