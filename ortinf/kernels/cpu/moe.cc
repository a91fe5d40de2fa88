// The custom op `ortinf.MoE`: a mixture-of-experts block's routing and routed experts in one node per
// layer (the router's MatMul and any shared expert stay in the graph).
//
//   hidden [T, H] f32, router_logits [T, E] f32,
//   gate_up: f32 panels [E, 2I / 16, H, 16] or packed u8 [E, bytes], gate_up_scales: f32 [0] or [E, tiles, blocks, 16],
//   down:    f32 panels [E, H / 16, I, 16]  or packed u8 [E, bytes], down_scales:    f32 [0] or [E, tiles, blocks, 16],
//   (fp32 panels: panel_gemm.h; N not a multiple of 16 is zero-padded to one)
//   gate_up_bias [E, 2I] f32 (optional), down_bias [E, H] f32 (optional)
//   attributes: top_k, normalize (renormalise the k weights), activation (0: silu(gate) * up with the
//   columns [gate | up]; 1: gpt-oss's interleaved gate/up, clamped at `limit`, (up + 1) * gate *
//   sigmoid(alpha * gate)), alpha, limit, bits (0: fp32 experts; 8 or 4: QMatMul's packed layout per
//   expert, qmatmul_impl.h), block_size, hidden_size H, intermediate_size I
//   -> [T, H] f32
//
// Routing is ortinf/exporter/moe.py's (the portable graph's): softmax over the E logits in float32, the k
// largest with ties to the lower expert index (ONNX TopK's rule), renormalised when `normalize`. Each
// expert then runs on its own tokens only, through both GEMMs; a token's output is the sum of w * y
// over its experts in expert order. A one-token step reads only its k experts' weights: the portable
// graph's ~10 nodes per expert per layer (NonZero, gathers, a zero-row MatMul for every expert no
// token chose, ScatterND) become one node, which is what a one-sequence decode step pays for.
//
// Threads: the GEMMs run as jobs of (expert, up to 64 rows, 64 columns) on ORT's intra-op pool. A
// row's result never depends on the rows beside it (panel_gemm.h, qmatmul_impl.h), so neither the batch
// nor the thread count changes a token.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "panel_gemm.h"
#include "ort_glue.h"
#include "qmatmul_impl.h"

namespace ortinf {
namespace {

constexpr int64_t kJobRows = 64, kJobCols = 64;
constexpr size_t kInputs = 8;

struct Kernel {
  int64_t top_k = 0, normalize = 0, activation = 0, bits = 0, block = 0, H = 0, I = 0;
  float alpha = 0.f, limit = 0.f;
};

// One GEMM of the op (gate_up or down) over every active expert's rows, grouped by expert.
struct Gemm {
  int64_t K = 0, N = 0;
  const float* w = nullptr;        // fp32 panels: [E, ceil(N / 16), K, 16]
  const uint8_t* packed = nullptr;  // quantized: [E, expert_bytes]
  const float* scales = nullptr;    // [E, tiles, blocks, 16]
  const float* bias = nullptr;      // [E, N] or null
  int64_t expert_bytes = 0, Kp = 0, blocks = 0, tiles = 0;
  const float* x = nullptr;  // [R, K] rows grouped by expert
  float* out = nullptr;      // [R, N]
  std::vector<int8_t> xq;
  std::vector<float> xscale;
  std::vector<int32_t> xsum;
};

struct Job {
  int64_t expert, m0, m1, n0, n1;
};

struct Call {
  const Kernel* k;
  Gemm* gemm;
  const std::vector<int64_t>* starts;  // [E + 1]: expert e's rows are starts[e] .. starts[e + 1]
  std::vector<Job> jobs;
};

QGemm qgemm_of(const Kernel& k, const Gemm& g, int64_t expert, int64_t rows) {
  return {g.xq.data(), g.xscale.data(), g.xsum.data(), g.packed + expert * g.expert_bytes,
          g.scales + expert * g.tiles * g.blocks * kTile, g.bias != nullptr ? g.bias + expert * g.N : nullptr,
          g.out, rows, g.N, g.Kp, g.blocks, k.block, k.bits};
}

void run_job(void* data, size_t index) {
  const Call* call = static_cast<const Call*>(data);
  const Job& job = call->jobs[index];
  const Gemm& g = *call->gemm;
  const int64_t rows = (*call->starts).back();
  if (call->k->bits == 0) {
    const SGemm s{g.x, g.w + job.expert * g.tiles * g.K * kPanel, g.bias != nullptr ? g.bias + job.expert * g.N : nullptr, g.out, rows,
                  g.K, g.N};
    panel_kernels().sgemm(s, job.m0, job.m1, job.n0, job.n1);
  } else {
    qmatmul_kernels().gemm(qgemm_of(*call->k, g, job.expert, rows), job.m0, job.m1, job.n0 / kTile, (job.n1 + kTile - 1) / kTile);
  }
}

void quantize_job(void* data, size_t index) {
  const Call* call = static_cast<const Call*>(data);
  const Gemm& g = *call->gemm;
  const int64_t rows = (*call->starts).back(), m0 = static_cast<int64_t>(index) * 16;
  qmatmul_kernels().quantize(g.x, g.K, g.K, qgemm_of(*call->k, g, 0, rows), m0, std::min(rows, m0 + 16));
}

OrtStatus* run_gemm(const Kernel& k, Gemm& g, const std::vector<int64_t>& starts, OrtKernelContext* context) {
  const int64_t rows = starts.back();
  Call call{&k, &g, &starts, {}};
  if (k.bits != 0) {  // the activations, per token and block of K (every expert's rows alike)
    g.xq.assign(static_cast<size_t>(rows * g.Kp), 0);
    g.xscale.resize(static_cast<size_t>(rows * g.blocks));
    g.xsum.resize(static_cast<size_t>(rows * g.blocks));
    const size_t jobs = static_cast<size_t>((rows + 15) / 16);
    if (jobs > 1) {
      RETURN_IF_ERROR(g_api->KernelContext_ParallelFor(context, quantize_job, jobs, 0, &call));
    } else {
      quantize_job(&call, 0);
    }
  }
  const int64_t cols = kJobCols;  // whole panels / tiles of 16
  for (size_t e = 0; e + 1 < starts.size(); ++e)
    for (int64_t m0 = starts[e]; m0 < starts[e + 1]; m0 += kJobRows)
      for (int64_t n0 = 0; n0 < g.N; n0 += cols)
        call.jobs.push_back({static_cast<int64_t>(e), m0, std::min(starts[e + 1], m0 + kJobRows), n0, std::min(g.N, n0 + cols)});
  if (call.jobs.size() <= 1) {
    if (!call.jobs.empty()) run_job(&call, 0);
    return nullptr;
  }
  return g_api->KernelContext_ParallelFor(context, run_job, call.jobs.size(), 0, &call);
}

// Reads gate_up or down (inputs 2/3 or 4/5, biases 6/7) into g, checking every size.
OrtStatus* weights(const Kernel& k, const Tensor& w, const Tensor& scales, const Tensor& bias, int64_t E, int64_t K, int64_t N,
                   const char* name, Gemm* g) {
  g->K = K;
  g->N = N;
  const std::string what = std::string("MoE: ") + name;
  g->tiles = (N + kTile - 1) / kTile;  // 16-column panels (fp32) or tiles (quantized)
  if (k.bits == 0) {
    if (w.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || w.shape != std::vector<int64_t>{E, g->tiles, K, kPanel})
      return fail(what + " must be float32 panels [" + std::to_string(E) + ", " + std::to_string(g->tiles) + ", " +
                  std::to_string(K) + ", 16]");
    g->w = static_cast<const float*>(w.data);
  } else {
    g->blocks = (K + k.block - 1) / k.block;
    g->Kp = g->blocks * k.block;
    g->expert_bytes = g->tiles * (k.bits == 8 ? g->Kp * kTile : g->Kp * kTile / 2);
    if (w.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 || w.size() != E * g->expert_bytes)
      return fail(what + " must be uint8 with " + std::to_string(E * g->expert_bytes) + " bytes (QMatMul's packing per expert)");
    if (scales.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || scales.size() != E * g->tiles * g->blocks * kTile)
      return fail(what + " scales must be float32 [E, tiles, blocks, 16]");
    g->packed = static_cast<const uint8_t*>(w.data);
    g->scales = static_cast<const float*>(scales.data);
  }
  if (bias.data != nullptr) {
    if (bias.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || bias.size() != E * N) return fail(what + " bias must be float32 [E, N]");
    g->bias = static_cast<const float*>(bias.data);
  }
  return nullptr;
}

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

OrtStatus* compute(const Kernel& k, OrtKernelContext* context) {
  size_t given = 0;
  RETURN_IF_ERROR(g_api->KernelContext_GetInputCount(context, &given));
  Tensor t[kInputs];
  for (size_t i = 0; i < std::min(given, kInputs); ++i) {
    const OrtValue* value = nullptr;
    RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, i, &value));
    if (value == nullptr) {
      if (i < 6 && i != 3 && i != 5) return fail("MoE: a required input is missing");
      continue;
    }
    RETURN_IF_ERROR(read_input(context, i, &t[i]));
  }
  const Tensor &hidden = t[0], &logits = t[1];
  if (hidden.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || hidden.shape.size() != 2 || hidden.shape[1] != k.H)
    return fail("MoE: hidden must be float32 [tokens, " + std::to_string(k.H) + "]");
  const int64_t T = hidden.shape[0];
  if (logits.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || logits.shape.size() != 2 || logits.shape[0] != T ||
      logits.shape[1] < k.top_k)
    return fail("MoE: router_logits must be float32 [tokens, experts] with at least top_k experts");
  const int64_t E = logits.shape[1], H = k.H, I = k.I;
  Gemm up, down;
  RETURN_IF_ERROR(weights(k, t[2], t[3], t[6], E, H, 2 * I, "gate_up", &up));
  RETURN_IF_ERROR(weights(k, t[4], t[5], t[7], E, I, H, "down", &down));

  OrtValue* output = nullptr;
  const int64_t out_shape[2] = {T, H};
  RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, out_shape, 2, &output));
  float* out = nullptr;
  RETURN_IF_ERROR(g_api->GetTensorMutableData(output, reinterpret_cast<void**>(&out)));
  if (T == 0) return nullptr;

  // Routing: each token's k experts (ascending expert index) and weights.
  const float* router = static_cast<const float*>(logits.data);
  std::vector<int64_t> chosen(static_cast<size_t>(T * k.top_k));
  std::vector<float> weight(static_cast<size_t>(T * k.top_k));
  std::vector<float> probs(static_cast<size_t>(E));
  std::vector<int64_t> count(static_cast<size_t>(E + 1), 0);
  for (int64_t tok = 0; tok < T; ++tok) {
    const float* row = router + tok * E;
    const float top = *std::max_element(row, row + E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += (probs[e] = std::exp(row[e] - top));
    for (int64_t e = 0; e < E; ++e) probs[e] /= sum;
    int64_t* ids = &chosen[tok * k.top_k];
    float* w = &weight[tok * k.top_k];
    float total = 0.f;
    for (int64_t j = 0; j < k.top_k; ++j) {  // the largest left, the lower index on ties
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (probs[e] >= 0.f && (best < 0 || probs[e] > probs[best])) best = e;
      ids[j] = best;
      w[j] = probs[best];
      total += probs[best];
      probs[best] = -1.f;
    }
    if (k.normalize)
      for (int64_t j = 0; j < k.top_k; ++j) w[j] /= total;
    std::vector<std::pair<int64_t, float>> sorted;
    for (int64_t j = 0; j < k.top_k; ++j) sorted.push_back({ids[j], w[j]});
    std::sort(sorted.begin(), sorted.end());
    for (int64_t j = 0; j < k.top_k; ++j) {
      ids[j] = sorted[j].first;
      w[j] = sorted[j].second;
      ++count[ids[j] + 1];
    }
  }
  // Rows grouped by expert, tokens ascending within each: row_of[tok, j] is the row of token tok's j-th expert.
  std::vector<int64_t> starts(count);
  for (int64_t e = 0; e < E; ++e) starts[e + 1] += starts[e];
  const int64_t R = starts[E];
  std::vector<int64_t> next(starts.begin(), starts.end() - 1), row_of(static_cast<size_t>(T * k.top_k));
  std::vector<float> x(static_cast<size_t>(R * H)), y1(static_cast<size_t>(R * 2 * I)), act(static_cast<size_t>(R * I)),
      y2(static_cast<size_t>(R * H));
  const float* in = static_cast<const float*>(hidden.data);
  for (int64_t tok = 0; tok < T; ++tok)
    for (int64_t j = 0; j < k.top_k; ++j) {
      const int64_t r = next[chosen[tok * k.top_k + j]]++;
      row_of[tok * k.top_k + j] = r;
      std::memcpy(&x[r * H], in + tok * H, static_cast<size_t>(H) * sizeof(float));
    }

  up.x = x.data();
  up.out = y1.data();
  RETURN_IF_ERROR(run_gemm(k, up, starts, context));
  for (int64_t r = 0; r < R; ++r) {
    const float* g = &y1[r * 2 * I];
    float* a = &act[r * I];
    if (k.activation == 0) {
      for (int64_t i = 0; i < I; ++i) a[i] = g[i] * sigmoid(g[i]) * g[I + i];
    } else {
      for (int64_t i = 0; i < I; ++i) {
        const float gate = std::min(g[2 * i], k.limit), lin = std::max(-k.limit, std::min(g[2 * i + 1], k.limit));
        a[i] = (lin + 1.f) * (gate * sigmoid(gate * k.alpha));
      }
    }
  }
  down.x = act.data();
  down.out = y2.data();
  RETURN_IF_ERROR(run_gemm(k, down, starts, context));

  for (int64_t tok = 0; tok < T; ++tok) {
    float* o = out + tok * H;
    std::fill(o, o + H, 0.f);
    for (int64_t j = 0; j < k.top_k; ++j) {  // in expert order, as the portable graph's ScatterND adds
      const float w = weight[tok * k.top_k + j];
      const float* y = &y2[row_of[tok * k.top_k + j] * H];
      for (int64_t h = 0; h < H; ++h) o[h] += y[h] * w;
    }
  }
  return nullptr;
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** kernel) {
  auto* k = new Kernel();
  attr_int(info, "top_k", 0, &k->top_k);
  attr_int(info, "normalize", 0, &k->normalize);
  attr_int(info, "activation", 0, &k->activation);
  attr_int(info, "bits", 0, &k->bits);
  attr_int(info, "block_size", 0, &k->block);
  attr_int(info, "hidden_size", 0, &k->H);
  attr_int(info, "intermediate_size", 0, &k->I);
  attr_float(info, "alpha", 0.f, &k->alpha);
  attr_float(info, "limit", 0.f, &k->limit);
  if (k->top_k <= 0 || k->H <= 0 || k->I <= 0 || (k->activation != 0 && k->activation != 1) ||
      (k->bits != 0 && k->bits != 8 && k->bits != 4) || (k->bits != 0 && (k->block < 8 || k->block % 8 != 0))) {
    delete k;
    return fail("MoE: top_k, hidden_size and intermediate_size must be positive, activation 0 or 1, bits 0, 8 or 4 "
                "(quantized: block_size a positive multiple of 8)");
  }
  *kernel = k;
  return nullptr;
}

OrtStatus* ORT_API_CALL kernel_compute(void* kernel, OrtKernelContext* context) {
  return compute(*static_cast<const Kernel*>(kernel), context);
}

void ORT_API_CALL kernel_destroy(void* kernel) { delete static_cast<Kernel*>(kernel); }

const char* ORT_API_CALL op_name(const OrtCustomOp*) { return "MoE"; }
size_t ORT_API_CALL input_count(const OrtCustomOp*) { return kInputs; }
size_t ORT_API_CALL output_count(const OrtCustomOp*) { return 1; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t index) {
  return index == 2 || index == 4 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_required(const OrtCustomOp*, size_t index) {
  return index < 6 && index != 3 && index != 5 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_required(const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; }

OrtCustomOp g_moe = make_op({op_name, input_type, input_count, output_type, output_count, input_required, output_required,
                             create_kernel, kernel_compute, kernel_destroy});

}  // namespace

OrtCustomOp* moe_op() { return &g_moe; }

}  // namespace ortinf
