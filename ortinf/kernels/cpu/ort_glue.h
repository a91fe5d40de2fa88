// What every op of the library needs from ONNX Runtime's C API: the API table, errors, reading an
// input's shape and data, attributes, and the parts of an OrtCustomOp that are the same for all ops.
// (Why the C API and version 17: register.cc's header comment.)
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ortinf {

constexpr uint32_t kApiVersion = 17;
inline const OrtApi* g_api = nullptr;  // set once by RegisterCustomOps (register.cc)

inline OrtStatus* fail(const std::string& message) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, message.c_str()); }

#define RETURN_IF_ERROR(expr)               \
  do {                                      \
    OrtStatus* status_ = (expr);            \
    if (status_ != nullptr) return status_; \
  } while (0)

struct Tensor {
  const void* data = nullptr;
  std::vector<int64_t> shape;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;

  int64_t size() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

inline OrtStatus* read_input(OrtKernelContext* context, size_t index, Tensor* out) {
  const OrtValue* value = nullptr;
  RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, index, &value));
  OrtTensorTypeAndShapeInfo* info = nullptr;
  RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(value, &info));
  size_t rank = 0;
  OrtStatus* status = g_api->GetDimensionsCount(info, &rank);
  if (status == nullptr) {
    out->shape.resize(rank);
    status = g_api->GetDimensions(info, out->shape.data(), rank);
  }
  if (status == nullptr) status = g_api->GetTensorElementType(info, &out->type);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  RETURN_IF_ERROR(status);
  void* data = nullptr;  // GetTensorData (const) is API 22; the mutable getter reads the same pointer
  RETURN_IF_ERROR(g_api->GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  out->data = data;
  return nullptr;
}

inline OrtStatus* attr_int(const OrtKernelInfo* info, const char* name, int64_t fallback, int64_t* out) {
  *out = fallback;
  OrtStatus* status = g_api->KernelInfoGetAttribute_int64(info, name, out);
  if (status != nullptr) g_api->ReleaseStatus(status);  // absent: keep the default
  return nullptr;
}

inline OrtStatus* attr_float(const OrtKernelInfo* info, const char* name, float fallback, float* out) {
  *out = fallback;
  OrtStatus* status = g_api->KernelInfoGetAttribute_float(info, name, out);
  if (status != nullptr) g_api->ReleaseStatus(status);
  return nullptr;
}

inline const char* ORT_API_CALL cpu_provider(const OrtCustomOp*) { return "CPUExecutionProvider"; }
inline OrtMemType ORT_API_CALL default_memory(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
inline int ORT_API_CALL zero(const OrtCustomOp*) { return 0; }
inline int ORT_API_CALL one(const OrtCustomOp*) { return 1; }

// The callbacks that make one op: its name, its inputs' and outputs' types, counts and whether each
// is required, and its kernel's life cycle.
struct OpCallbacks {
  const char*(ORT_API_CALL* name)(const OrtCustomOp*);
  ONNXTensorElementDataType(ORT_API_CALL* input_type)(const OrtCustomOp*, size_t);
  size_t(ORT_API_CALL* input_count)(const OrtCustomOp*);
  ONNXTensorElementDataType(ORT_API_CALL* output_type)(const OrtCustomOp*, size_t);
  size_t(ORT_API_CALL* output_count)(const OrtCustomOp*);
  OrtCustomOpInputOutputCharacteristic(ORT_API_CALL* input_required)(const OrtCustomOp*, size_t);
  OrtCustomOpInputOutputCharacteristic(ORT_API_CALL* output_required)(const OrtCustomOp*, size_t);
  OrtStatus*(ORT_API_CALL* create)(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void**);
  OrtStatus*(ORT_API_CALL* compute)(void*, OrtKernelContext*);
  void(ORT_API_CALL* destroy)(void*);
};

// An op's compute and destroy callbacks for its kernel type K, whose compute(const K&, OrtKernelContext*) is found
// by argument-dependent lookup in the op's own file.
template <typename K>
OrtStatus* ORT_API_CALL kernel_compute(void* kernel, OrtKernelContext* context) {
  return compute(*static_cast<const K*>(kernel), context);
}
template <typename K>
void ORT_API_CALL kernel_destroy(void* kernel) {
  delete static_cast<K*>(kernel);
}

// An OrtCustomOp for the CPU provider from an op's callbacks, every other field as all ops here share it.
inline OrtCustomOp make_op(const OpCallbacks& f) {
  OrtCustomOp op;
  std::memset(&op, 0, sizeof(op));  // fields past version 17 (in-place maps, ...) stay null and are not read
  op.version = kApiVersion;
  op.GetName = f.name;
  op.GetInputType = f.input_type;
  op.GetInputTypeCount = f.input_count;
  op.GetOutputType = f.output_type;
  op.GetOutputTypeCount = f.output_count;
  op.GetInputCharacteristic = f.input_required;
  op.GetOutputCharacteristic = f.output_required;
  op.CreateKernelV2 = f.create;
  op.KernelComputeV2 = f.compute;
  op.KernelDestroy = f.destroy;
  op.GetExecutionProviderType = cpu_provider;
  op.GetInputMemoryType = default_memory;
  op.GetVariadicInputMinArity = zero;
  op.GetVariadicInputHomogeneity = zero;
  op.GetVariadicOutputMinArity = zero;
  op.GetVariadicOutputHomogeneity = zero;
  op.GetStartVersion = one;
  op.GetEndVersion = one;
  return op;
}

// out[m, n0:n1] += residual[m, n0:n1] for rows m0 <= m < m1 (n1 clipped to N): a projection's job adding the layer's
// residual to what it wrote, while it is in cache (QMatMul's and BMatMul's residual input).
inline void add_residual(float* out, const float* residual, int64_t N, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  n1 = n1 < N ? n1 : N;
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t n = n0; n < n1; ++n) out[m * N + n] += residual[m * N + n];
}

// The library's ops, each defined in its own unit and registered together by register.cc.
OrtCustomOp* paged_attention_op();  // paged_attention.cc
const char* attention_isa();        // the instruction set PagedAttention's jobs run with (paged_attention.cc)
OrtCustomOp* qmatmul_op();          // qmatmul.cc
OrtCustomOp* moe_op();              // moe.cc
// BMatMul's two arithmetics (bmatmul.cc): bf16 math (activations rounded to bf16) or fp32 math on the bf16 weights,
// chosen per session by the config entry ortinf.bf16_math (RegisterCustomOps, register.cc).
OrtCustomOp* bmatmul_op(bool bf16_math);
OrtStatus* read_bf16_math(const OrtSessionOptions* options, bool* bf16_math);

}  // namespace ortinf
