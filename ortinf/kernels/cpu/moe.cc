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
// Threads: one KernelContext_ParallelFor per step (issue 57, item 4). Its jobs are workers that take tasks from
// one list, in list order, through an atomic counter (Step::next):
//   1. gather: chunks of 16 tokens; each token's row copied (fp32) or quantized once (int8/int4: per token and
//      block, as QMatMul does) into the rows of its k experts (rows grouped by expert, tokens ascending);
//   2. gate_up: (expert, up to 64 rows, 64 columns), for every chosen expert side by side; the last task of a
//      row group to finish (a counter per group) applies the activation to the group's rows (and quantizes
//      them for the down GEMM) and marks the group ready;
//   3. down: (expert, up to 64 rows, 64 columns), each waiting for its group to be ready; the last down task
//      that touches a token (a counter per token) sums the token's k rows into the output, w * y in expert order.
// The step before issued one ParallelFor per GEMM, with the copy, the activation and the combine in serial around
// them (one thread working, one waiting) and each token quantized k times. Measured at the benchmark's shape
// (benchmarks/moe.py: H 512, 16 experts of 384, k 2; one token): the node's fixed cost is ~4 us (ORT ~2, routing and
// buffers ~1.5, an empty ParallelFor ~1), the rest is the GEMVs; the one list took 10-15 us off a 60-75 us int8 node.
//
// Why the waits cannot deadlock, whatever the pool does with the workers: a task only ever waits for tasks
// before it in the list, tasks are taken in list order, and a taken task is run at once by the thread that took
// it; so every task waited for is either done or running on another thread, and the earliest unfinished task
// waits for nothing. With one thread (or a pool that runs the workers one after another) the first worker runs
// every task in order and never waits. The waits spin (pause, then yield: another process may hold the core).
//
// Determinism: every row is computed by the same kernel calls whichever thread takes its task, and a row's result
// never depends on the rows beside it (panel_gemm.h, qmatmul_impl.h); the sum over a token's experts runs in
// expert order on whichever thread finishes last. So neither the batch nor the thread count changes a token.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "panel_gemm.h"
#include "ort_glue.h"
#include "qmatmul_impl.h"

namespace ortinf {
namespace {

constexpr int64_t kJobRows = 64, kJobCols = 64, kGatherTokens = 16;
constexpr size_t kInputs = 8;

struct Kernel {
  int64_t top_k = 0, normalize = 0, activation = 0, bits = 0, block = 0, H = 0, I = 0;
  float alpha = 0.f, limit = 0.f;
};

// One GEMM of the op (gate_up or down) over every chosen expert's rows, grouped by expert.
struct Gemm {
  int64_t K = 0, N = 0;
  const float* w = nullptr;        // fp32 panels: [E, ceil(N / 16), K, 16]
  const uint8_t* packed = nullptr;  // quantized: [E, expert_bytes]
  const float* scales = nullptr;    // [E, tiles, blocks, 16]
  const float* bias = nullptr;      // [E, N] or null
  int64_t expert_bytes = 0, Kp = 0, blocks = 0, tiles = 0;
  const float* x = nullptr;  // fp32: [R, K] rows grouped by expert
  float* out = nullptr;      // [R, N]
  std::vector<int8_t> xq;    // quantized: the rows' activations [R, Kp], scales and sums [R, blocks]
  std::vector<float> xscale;
  std::vector<int32_t> xsum;
};

// A row group: up to kJobRows rows of one expert (its tokens, ascending).
struct Group {
  int64_t expert, m0, m1;
};

enum Kind : int32_t { kGather, kGateUp, kDown };
struct Task {
  Kind kind;
  int64_t group;   // gate_up / down: the row group
  int64_t n0, n1;  // columns (gather: tokens)
};

// One call's routing, buffers, task list and counters, shared by the workers.
struct Step {
  const Kernel* k = nullptr;
  Gemm up, down;
  int64_t T = 0, R = 0;
  const float* hidden = nullptr;
  float* out = nullptr;
  std::vector<int64_t> row_of;    // [T, top_k]: the row of token t's j-th expert (ascending expert index)
  std::vector<int64_t> token_of;  // [R]
  std::vector<float> weight;      // [T, top_k]
  std::vector<Group> groups;
  std::vector<Task> tasks;
  std::vector<float> x, y1, act, y2;
  std::unique_ptr<std::atomic<int64_t>[]> group_left;  // gate_up tasks of the group not yet done
  std::unique_ptr<std::atomic<int32_t>[]> group_ready;  // the group's activations are in act (and down.xq)
  std::unique_ptr<std::atomic<int64_t>[]> token_left;  // down tasks touching the token not yet done
  std::atomic<int64_t> gather_left{0};
  std::atomic<size_t> next{0};
};

QGemm qgemm_of(const Kernel& k, const Gemm& g, int64_t expert, int64_t rows) {
  return {g.xq.data(), g.xscale.data(), g.xsum.data(), g.packed + expert * g.expert_bytes,
          g.scales + expert * g.tiles * g.blocks * kTile, g.bias != nullptr ? g.bias + expert * g.N : nullptr,
          g.out, rows, g.N, g.Kp, g.blocks, k.block, k.bits};
}

// Rows m0..m1 (one expert's) x columns n0..n1 (a multiple of 16 from n0) of one GEMM.
void gemm(const Step& s, const Gemm& g, int64_t expert, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (s.k->bits == 0) {
    const SGemm sg{g.x, g.w + expert * g.tiles * g.K * kPanel, g.bias != nullptr ? g.bias + expert * g.N : nullptr, g.out, s.R,
                   g.K, g.N};
    panel_kernels().sgemm(sg, m0, m1, n0, n1);
  } else {
    qmatmul_kernels().gemm(qgemm_of(*s.k, g, expert, s.R), m0, m1, n0 / kTile, (n1 + kTile - 1) / kTile);
  }
}

inline void pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until `ready` holds; past a few microseconds it yields the core (another process may want it, and the
// task waited for may be running on a thread that the kernel has parked).
template <typename Ready>
void wait_until(Ready ready) {
  for (int spins = 0; !ready(); ++spins) {
    if (spins < 2048) {
      pause();
    } else {
      std::this_thread::yield();
    }
  }
}

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }

// Tokens n0..n1 into their k rows: copied (fp32), or quantized once and the result copied (int8/int4).
void gather(Step& s, int64_t t0, int64_t t1) {
  const Kernel& k = *s.k;
  const int64_t H = k.H;
  for (int64_t tok = t0; tok < t1; ++tok) {
    const float* row = s.hidden + tok * H;
    const int64_t* rows = &s.row_of[tok * k.top_k];
    if (k.bits == 0) {
      for (int64_t j = 0; j < k.top_k; ++j) std::memcpy(&s.x[rows[j] * H], row, static_cast<size_t>(H) * sizeof(float));
      continue;
    }
    Gemm& g = s.up;
    QGemm q = qgemm_of(k, g, 0, 1);
    q.xq = &g.xq[rows[0] * g.Kp];
    q.xscale = &g.xscale[rows[0] * g.blocks];
    q.xsum = &g.xsum[rows[0] * g.blocks];
    qmatmul_kernels().quantize(row, H, H, q, 0, 1);
    for (int64_t j = 1; j < k.top_k; ++j) {
      std::memcpy(&g.xq[rows[j] * g.Kp], q.xq, static_cast<size_t>(g.Kp));
      std::memcpy(&g.xscale[rows[j] * g.blocks], q.xscale, static_cast<size_t>(g.blocks) * sizeof(float));
      std::memcpy(&g.xsum[rows[j] * g.blocks], q.xsum, static_cast<size_t>(g.blocks) * sizeof(int32_t));
    }
  }
}

// The activation of rows m0..m1 (their gate_up columns all done), quantized for the down GEMM where it is.
void activate(Step& s, int64_t m0, int64_t m1) {
  const Kernel& k = *s.k;
  const int64_t I = k.I;
  for (int64_t r = m0; r < m1; ++r) {
    const float* g = &s.y1[r * 2 * I];
    float* a = &s.act[r * I];
    if (k.activation == 0) {
      for (int64_t i = 0; i < I; ++i) a[i] = g[i] * sigmoid(g[i]) * g[I + i];
    } else {
      for (int64_t i = 0; i < I; ++i) {
        const float gate = std::min(g[2 * i], k.limit), lin = std::max(-k.limit, std::min(g[2 * i + 1], k.limit));
        a[i] = (lin + 1.f) * (gate * sigmoid(gate * k.alpha));
      }
    }
  }
  if (k.bits != 0) qmatmul_kernels().quantize(s.act.data(), I, I, qgemm_of(k, s.down, 0, s.R), m0, m1);
}

// A token's output: the sum of w * y over its experts, in expert order (the portable graph's ScatterND adds so).
void combine(const Step& s, int64_t tok) {
  const int64_t H = s.k->H, top_k = s.k->top_k;
  float* o = s.out + tok * H;
  std::fill(o, o + H, 0.f);
  for (int64_t j = 0; j < top_k; ++j) {
    const float w = s.weight[tok * top_k + j];
    const float* y = &s.y2[s.row_of[tok * top_k + j] * H];
    for (int64_t h = 0; h < H; ++h) o[h] += y[h] * w;
  }
}

void run_task(Step& s, const Task& task) {
  if (task.kind == kGather) {
    gather(s, task.n0, task.n1);
    s.gather_left.fetch_sub(1, std::memory_order_release);
    return;
  }
  const Group& group = s.groups[task.group];
  if (task.kind == kGateUp) {
    wait_until([&] { return s.gather_left.load(std::memory_order_acquire) == 0; });
    gemm(s, s.up, group.expert, group.m0, group.m1, task.n0, task.n1);
    if (s.group_left[task.group].fetch_sub(1, std::memory_order_acq_rel) == 1) {  // the group's last: every column done
      activate(s, group.m0, group.m1);
      s.group_ready[task.group].store(1, std::memory_order_release);
    }
    return;
  }
  wait_until([&] { return s.group_ready[task.group].load(std::memory_order_acquire) != 0; });
  gemm(s, s.down, group.expert, group.m0, group.m1, task.n0, task.n1);
  for (int64_t r = group.m0; r < group.m1; ++r) {
    const int64_t tok = s.token_of[r];
    if (s.token_left[tok].fetch_sub(1, std::memory_order_acq_rel) == 1) combine(s, tok);
  }
}

void worker(void* data, size_t) {
  Step& s = *static_cast<Step*>(data);
  for (;;) {
    const size_t i = s.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= s.tasks.size()) return;
    run_task(s, s.tasks[i]);
  }
}

// Workers for one step: as many as the machine has hardware threads (the pool runs at most its own number at once;
// a worker that finds the list empty returns at once), and no more than there are tasks.
size_t worker_count(size_t tasks) {
  static const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  return std::min(tasks, threads);
}

// Builds the step's tasks and counters (routing done: row_of, token_of, groups) and runs them.
OrtStatus* run_step(Step& s, const std::vector<int64_t>& starts, OrtKernelContext* context) {
  const Kernel& k = *s.k;
  const int64_t E = static_cast<int64_t>(starts.size()) - 1;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t m0 = starts[e]; m0 < starts[e + 1]; m0 += kJobRows) s.groups.push_back({e, m0, std::min(starts[e + 1], m0 + kJobRows)});
  const int64_t G = static_cast<int64_t>(s.groups.size());
  const int64_t up_tasks = (s.up.N + kJobCols - 1) / kJobCols, down_tasks = (s.down.N + kJobCols - 1) / kJobCols;
  s.group_left.reset(new std::atomic<int64_t>[G]);
  s.group_ready.reset(new std::atomic<int32_t>[G]);
  s.token_left.reset(new std::atomic<int64_t>[s.T]);
  for (int64_t g = 0; g < G; ++g) {
    s.group_left[g].store(up_tasks, std::memory_order_relaxed);
    s.group_ready[g].store(0, std::memory_order_relaxed);
  }
  // each of a token's k rows lies in one group, whose every down task touches it
  for (int64_t t = 0; t < s.T; ++t) s.token_left[t].store(k.top_k * down_tasks, std::memory_order_relaxed);

  // the list's order is what makes the waits safe (a task waits only for tasks before it): gather, gate_up, down
  for (int64_t t0 = 0; t0 < s.T; t0 += kGatherTokens) s.tasks.push_back({kGather, -1, t0, std::min(s.T, t0 + kGatherTokens)});
  s.gather_left.store(static_cast<int64_t>(s.tasks.size()), std::memory_order_relaxed);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n0 = 0; n0 < s.up.N; n0 += kJobCols) s.tasks.push_back({kGateUp, g, n0, std::min(s.up.N, n0 + kJobCols)});
  for (int64_t g = 0; g < G; ++g)
    for (int64_t n0 = 0; n0 < s.down.N; n0 += kJobCols) s.tasks.push_back({kDown, g, n0, std::min(s.down.N, n0 + kJobCols)});

  const size_t workers = worker_count(s.tasks.size());
  if (workers <= 1) {
    worker(&s, 0);
    return nullptr;
  }
  return g_api->KernelContext_ParallelFor(context, worker, workers, 0, &s);
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
  Step s;
  s.k = &k;
  RETURN_IF_ERROR(weights(k, t[2], t[3], t[6], E, H, 2 * I, "gate_up", &s.up));
  RETURN_IF_ERROR(weights(k, t[4], t[5], t[7], E, I, H, "down", &s.down));

  OrtValue* output = nullptr;
  const int64_t out_shape[2] = {T, H};
  RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, out_shape, 2, &output));
  RETURN_IF_ERROR(g_api->GetTensorMutableData(output, reinterpret_cast<void**>(&s.out)));
  if (T == 0) return nullptr;

  // Routing (serial: E exponentials per token, microseconds even for a batch): each token's k experts in ascending
  // expert index, and their weights.
  const float* router = static_cast<const float*>(logits.data);
  std::vector<int64_t> chosen(static_cast<size_t>(T * k.top_k));
  s.weight.resize(static_cast<size_t>(T * k.top_k));
  std::vector<float> probs(static_cast<size_t>(E));
  std::vector<int64_t> count(static_cast<size_t>(E + 1), 0);
  for (int64_t tok = 0; tok < T; ++tok) {
    const float* row = router + tok * E;
    const float top = *std::max_element(row, row + E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += (probs[e] = std::exp(row[e] - top));
    for (int64_t e = 0; e < E; ++e) probs[e] /= sum;
    int64_t* ids = &chosen[tok * k.top_k];
    float* w = &s.weight[tok * k.top_k];
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
    for (int64_t j = 1; j < k.top_k; ++j)  // ascending expert index (insertion sort: k is small)
      for (int64_t i = j; i > 0 && ids[i - 1] > ids[i]; --i) {
        std::swap(ids[i - 1], ids[i]);
        std::swap(w[i - 1], w[i]);
      }
    for (int64_t j = 0; j < k.top_k; ++j) ++count[ids[j] + 1];
  }
  // Rows grouped by expert, tokens ascending within each: row_of[tok, j] is the row of token tok's j-th expert.
  std::vector<int64_t> starts(count);
  for (int64_t e = 0; e < E; ++e) starts[e + 1] += starts[e];
  s.T = T;
  s.R = starts[E];
  s.hidden = static_cast<const float*>(hidden.data);
  std::vector<int64_t> next(starts.begin(), starts.end() - 1);
  s.row_of.resize(static_cast<size_t>(T * k.top_k));
  s.token_of.resize(static_cast<size_t>(s.R));
  for (int64_t tok = 0; tok < T; ++tok)
    for (int64_t j = 0; j < k.top_k; ++j) {
      const int64_t r = next[chosen[tok * k.top_k + j]]++;
      s.row_of[tok * k.top_k + j] = r;
      s.token_of[r] = tok;
    }

  // Buffers: every element is written by its task before another task reads it.
  const int64_t R = s.R;
  s.y1.resize(static_cast<size_t>(R * 2 * I));
  s.act.resize(static_cast<size_t>(R * I));
  s.y2.resize(static_cast<size_t>(R * H));
  if (k.bits == 0) {
    s.x.resize(static_cast<size_t>(R * H));
    s.up.x = s.x.data();
    s.down.x = s.act.data();
  } else {
    for (Gemm* g : {&s.up, &s.down}) {
      g->xq.resize(static_cast<size_t>(R * g->Kp));
      g->xscale.resize(static_cast<size_t>(R * g->blocks));
      g->xsum.resize(static_cast<size_t>(R * g->blocks));
    }
  }
  s.up.out = s.y1.data();
  s.down.out = s.y2.data();
  return run_step(s, starts, context);
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
