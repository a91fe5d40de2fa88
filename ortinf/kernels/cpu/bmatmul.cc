// The custom op `ortinf.BMatMul`: Y = A x W with W in bf16 (a bf16 checkpoint's weights, exactly), A and Y float32.
//
//   A [..., K] f32, W [K, N] bf16 (a constant initializer: model.onnx's own, ortinf/exporter/bf16.py),
//   residual [..., N] f32 (optional: Y = A x W + residual, the layer's residual Add taken in by
//   ortinf/exporter/cpu_fusion.py; M x N values, and Y takes its shape where it has more axes than A's)
//   K, N (int attributes)
//   -> Y [..., N] f32
//
// Why an op: ORT's CPU provider has no bf16 MatMul, so the portable graph's Cast(W) -> MatMul is folded
// into an fp32 weight when the session is made: twice the bytes in memory and twice the bytes each token
// reads. Here the kernel packs W into 16-column panels when it is created (panel_gemm.h: a job streams
// its panels front to back), gives the mapped source pages back (mapped_pages.h), and widens the bf16
// values to float32 in registers: fp32 arithmetic on exactly the checkpoint's weights, at half the
// bandwidth. A row's result does not depend on the rows beside it (the same loop order for each).
//
// Arithmetic, per session (the config entry ortinf.bf16_math, read when the library is registered: EngineConfig's
// bf16_math, `--bf16-math`): "bf16", the default, rounds the activations to bf16 (round to nearest even, as PyTorch's
// bf16 inference does) and sums the exact products in fp32: on AVX512_BF16 with vdpbf16ps (panel_gemm_avx512bf16.cc,
// twice the fp32 FMA rate: a 512-row GEMM 2.4x faster), elsewhere by widening the rounded values (the same numbers, in
// another order of sums). "fp32" keeps the activations in fp32 (the export's verification, and users who want fp32
// math on bf16 weights). Two op records, one per arithmetic, so that sessions of both kinds live in one process.
//
// Threads: jobs of up to 64 rows x 64 columns on ORT's intra-op pool (KernelContext_ParallelFor).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mapped_pages.h"
#include "packed_store.h"
#include "ort_glue.h"
#include "panel_gemm.h"

namespace ortinf {
namespace {

constexpr int64_t kJobRows = 64, kJobCols = 64;

struct Kernel {
  int64_t K = 0, N = 0;
  bool bf16_math = true;
  Packed panels;  // region 0: [ceil(N / 16), K, 16], packed at creation or mapped from the packed store (packed_store.h)
  const uint16_t* panel_data() const { return static_cast<const uint16_t*>(panels.region[0]); }
};

struct Job {
  int64_t m0, m1, n0, n1;
};

struct Call {
  BGemm g;
  std::vector<Job> jobs;
  const float* residual = nullptr;  // [M, N] or null
};

void run_job(void* data, size_t index) {
  const Call* call = static_cast<const Call*>(data);
  const Job& job = call->jobs[index];
  (call->g.xb != nullptr ? panel_kernels().bgemm_dot : panel_kernels().bgemm)(call->g, job.m0, job.m1, job.n0, job.n1);
  if (call->residual != nullptr) add_residual(call->g.out, call->residual, call->g.N, job.m0, job.m1, job.n0, job.n1);
}

// x rounded to the nearest bf16 (ties to even; NaN stays NaN), kept as float32.
void round_to_bf16(const float* x, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, x + i, sizeof(bits));
    if ((bits & 0x7fffffffu) > 0x7f800000u)
      bits |= 0x00400000u;  // a quiet NaN, which truncation keeps a NaN
    else
      bits += 0x7fffu + ((bits >> 16) & 1u);
    bits &= 0xffff0000u;
    std::memcpy(out + i, &bits, sizeof(bits));
  }
}

OrtStatus* compute(const Kernel& k, OrtKernelContext* context) {
  Tensor a;
  RETURN_IF_ERROR(read_input(context, 0, &a));
  if (a.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || a.shape.empty() || a.shape.back() != k.K)
    return fail("BMatMul: A must be float32 [..., K] with K = " + std::to_string(k.K));
  std::vector<int64_t> out_shape = a.shape;
  out_shape.back() = k.N;
  size_t given = 0;
  RETURN_IF_ERROR(g_api->KernelContext_GetInputCount(context, &given));
  Tensor residual;
  const OrtValue* residual_value = nullptr;
  if (given > 2) RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, 2, &residual_value));
  if (residual_value != nullptr) {
    RETURN_IF_ERROR(read_input(context, 2, &residual));
    if (residual.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || residual.shape.empty() || residual.shape.back() != k.N ||
        residual.size() != a.size() / k.K * k.N)
      return fail("BMatMul: the residual must be float32 [..., N] with A's rows");
    if (residual.shape.size() > out_shape.size()) out_shape = residual.shape;
  }
  OrtValue* output = nullptr;
  RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, 0, out_shape.data(), out_shape.size(), &output));
  float* out = nullptr;
  RETURN_IF_ERROR(g_api->GetTensorMutableData(output, reinterpret_cast<void**>(&out)));
  const int64_t M = a.size() / k.K;
  if (M == 0) return nullptr;
  Call call{{static_cast<const float*>(a.data), k.panel_data(), nullptr, out, M, k.K, k.N}, {}, static_cast<const float*>(residual.data)};
  // bf16 math: A rounded to bf16 once. The calling thread's buffers, kept between calls (a fresh one faulted in its
  // pages every call: 9 MB for a 512-row down projection at 1.5B).
  thread_local std::vector<uint16_t> rounded;
  thread_local std::vector<float> widened;
  if (k.bf16_math && panel_kernels().bgemm_dot != nullptr && k.K % 2 == 0) {  // vdpbf16ps: pairs of k
    rounded.resize(static_cast<size_t>(M * k.K));
    panel_kernels().to_bf16(call.g.x, rounded.data(), M * k.K);
    call.g.xb = rounded.data();
  } else if (k.bf16_math) {  // the same rounding, then the widening path
    widened.resize(static_cast<size_t>(M * k.K));
    round_to_bf16(call.g.x, widened.data(), M * k.K);
    call.g.x = widened.data();
  }
  for (int64_t m0 = 0; m0 < M; m0 += kJobRows)
    for (int64_t n0 = 0; n0 < k.N; n0 += kJobCols)
      call.jobs.push_back({m0, std::min(M, m0 + kJobRows), n0, std::min(k.N, n0 + kJobCols)});
  if (call.jobs.size() == 1) {
    run_job(&call, 0);
    return nullptr;
  }
  return g_api->KernelContext_ParallelFor(context, run_job, call.jobs.size(), 0, &call);
}

// W [K, N] row-major -> panels [ceil(N / 16), K, 16], zero-padded columns.
void pack(Kernel* k, const uint16_t* w) {
  const int64_t panels = (k->N + kPanel - 1) / kPanel;
  // uninitialised: every value is written below
  auto owned = std::make_shared<PackedBuffer<uint16_t>>(packed_buffer<uint16_t>(static_cast<size_t>(panels * k->K * kPanel)));
  uint16_t* out = owned->get();
  k->panels = {owned, {out, nullptr}};
  if (k->N % kPanel != 0)  // the ragged last panel: zeros where no column is
    std::memset(out + (panels - 1) * k->K * kPanel, 0, static_cast<size_t>(k->K * kPanel) * sizeof(uint16_t));
  pack_in_parallel(panels, [&](int64_t first, int64_t last) {  // row by row: the mapped source is read front to back
    for (int64_t row = 0; row < k->K; ++row)
      for (int64_t p = first; p < last; ++p) {
        const int64_t n = p * kPanel, count = std::min<int64_t>(kPanel, k->N - n);
        std::memcpy(out + (p * k->K + row) * kPanel, w + row * k->N + n, count * sizeof(uint16_t));
      }
  });
}

OrtStatus* pack_constant_weight(const OrtKernelInfo* info, Kernel* k) {
  int constant = 0;
  const OrtValue* value = nullptr;
  RETURN_IF_ERROR(g_api->KernelInfoGetConstantInput_tensor(info, 1, &constant, &value));
  if (!constant || value == nullptr) return fail("BMatMul: the weight must be a constant initializer");
  OrtTensorTypeAndShapeInfo* shape = nullptr;
  RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(value, &shape));
  size_t rank = 0;
  int64_t dims[2] = {0, 0};
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  OrtStatus* status = g_api->GetDimensionsCount(shape, &rank);
  if (status == nullptr && rank == 2) status = g_api->GetDimensions(shape, dims, 2);
  if (status == nullptr) status = g_api->GetTensorElementType(shape, &type);
  g_api->ReleaseTensorTypeAndShapeInfo(shape);
  RETURN_IF_ERROR(status);
  if (type != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 || rank != 2 || dims[0] != k->K || dims[1] != k->N)
    return fail("BMatMul: the weight must be bfloat16 [K, N] = [" + std::to_string(k->K) + ", " + std::to_string(k->N) + "]");
  void* data = nullptr;
  RETURN_IF_ERROR(g_api->GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  const std::string key = "BMatMul/1 K=" + std::to_string(k->K) + " N=" + std::to_string(k->N) + " panel=" + std::to_string(kPanel);
  const size_t bytes[1] = {static_cast<size_t>((k->N + kPanel - 1) / kPanel * k->K * kPanel) * sizeof(uint16_t)};
  bool mapped = false;
  RETURN_IF_ERROR(find_packed(data, key, bytes, 1, &k->panels, &mapped));
  if (mapped) return nullptr;
  pack(k, static_cast<const uint16_t*>(data));
  release_mapped(data, static_cast<size_t>(k->K * k->N) * sizeof(uint16_t));
  remember_packed(data, key, k->panels, bytes, 1);
  return nullptr;
}

extern OrtCustomOp g_bmatmul_fp32;

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info, void** kernel) {
  auto* k = new Kernel();
  k->bf16_math = op != &g_bmatmul_fp32;
  attr_int(info, "K", 0, &k->K);
  attr_int(info, "N", 0, &k->N);
  OrtStatus* status = k->K > 0 && k->N > 0 ? pack_constant_weight(info, k) : fail("BMatMul: K and N must be positive");
  if (status != nullptr) {
    delete k;
    return status;
  }
  *kernel = k;
  return nullptr;
}

const char* ORT_API_CALL op_name(const OrtCustomOp*) { return "BMatMul"; }
size_t ORT_API_CALL input_count(const OrtCustomOp*) { return 3; }
size_t ORT_API_CALL output_count(const OrtCustomOp*) { return 1; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t index) {
  return index == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL required(const OrtCustomOp*, size_t index) {
  return index < 2 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}

const OpCallbacks kCallbacks{op_name, input_type, input_count, output_type, output_count, required, required, create_kernel,
                             kernel_compute<Kernel>, kernel_destroy<Kernel>};
OrtCustomOp g_bmatmul_bf16 = make_op(kCallbacks);
OrtCustomOp g_bmatmul_fp32 = make_op(kCallbacks);

}  // namespace

OrtCustomOp* bmatmul_op(bool bf16_math) { return bf16_math ? &g_bmatmul_bf16 : &g_bmatmul_fp32; }

OrtStatus* read_bf16_math(const OrtSessionOptions* options, bool* bf16_math) {
  constexpr const char* kEntry = "ortinf.bf16_math";
  int present = 0;
  RETURN_IF_ERROR(g_api->HasSessionConfigEntry(options, kEntry, &present));
  if (!present) return nullptr;
  char value[16] = {};
  size_t size = sizeof(value);
  OrtStatus* status = g_api->GetSessionConfigEntry(options, kEntry, value, &size);
  if (status != nullptr) {
    g_api->ReleaseStatus(status);  // longer than any right value
  } else if (std::strcmp(value, "bf16") == 0 || std::strcmp(value, "fp32") == 0) {
    *bf16_math = std::strcmp(value, "bf16") == 0;
    return nullptr;
  }
  return fail(std::string(kEntry) + " must be bf16 or fp32");
}

}  // namespace ortinf

// For `ortinf inspect` (read with ctypes): the instruction set the panel GEMMs (BMatMul, MoE's fp32 experts) run with.
extern "C" __attribute__((visibility("default"))) const char* ortinf_panel_gemm_isa() { return ortinf::panel_kernels().name; }
