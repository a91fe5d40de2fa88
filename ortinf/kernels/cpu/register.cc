// ortinf's kernel library for ONNX Runtime's CPU provider: where its ops are registered, and the list of units the
// build compiles (ortinf/kernels/build.py reads the "units:" line below; adding an op is a unit of its own, one line
// there and one CustomOpDomain_Add here).
//
// units: register paged_attention qmatmul moe bmatmul quantize packed_store panel_gemm
//
// (Each unit above is compiled once with the baseline flags; the per-instruction-set builds, attention_<isa>.cc,
// panel_gemm_<isa>.cc and qmatmul_<isa>.cc, are named by build.py's ISA tables.)
//
// Written against ORT's C API only (onnxruntime_c_api.h, one header) and not its C++ wrapper,
// because the wrapper stamps every op with the headers' ORT_API_VERSION (21 for the Debian trixie
// headers the build uses), which ORT 1.17-1.20 refuse ("Unsupported version '21'"). The library
// asks for API 17 and sets OrtCustomOp::version to 17, so the one binary loads into every ORT from
// 1.17 on (the C API is versioned and forward compatible). Nothing here needs a newer API:
// KernelContext_ParallelFor, the last call it uses, is from 1.17.

#include <onnxruntime_c_api.h>

#include "ort_glue.h"

extern "C" {

// Called by SessionOptions.register_custom_ops_library. The domain is created per call and never
// released: ORT keeps a pointer to it for the lifetime of every session built from these options.
__attribute__((visibility("default"))) OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  ortinf::g_api = api_base->GetApi(ortinf::kApiVersion);
  if (ortinf::g_api == nullptr) return nullptr;  // ORT older than 1.17: no API to report through; the ops stay unregistered
  const OrtApi* api = ortinf::g_api;
  bool bf16_math = true;  // the session config entry ortinf.bf16_math: "bf16" (the default) or "fp32"
  RETURN_IF_ERROR(ortinf::read_bf16_math(options, &bf16_math));
  OrtCustomOpDomain* domain = nullptr;
  RETURN_IF_ERROR(api->CreateCustomOpDomain("ortinf", &domain));
  RETURN_IF_ERROR(api->CustomOpDomain_Add(domain, ortinf::paged_attention_op()));
  RETURN_IF_ERROR(api->CustomOpDomain_Add(domain, ortinf::qmatmul_op()));
  RETURN_IF_ERROR(api->CustomOpDomain_Add(domain, ortinf::moe_op()));
  RETURN_IF_ERROR(api->CustomOpDomain_Add(domain, ortinf::bmatmul_op(bf16_math)));
  return api->AddCustomOpDomain(options, domain);
}

// For `ortinf providers` / `inspect` (read with ctypes): the instruction set the attention's jobs run with.
__attribute__((visibility("default"))) const char* ortinf_kernels_isa() { return ortinf::attention_isa(); }

}  // extern "C"
