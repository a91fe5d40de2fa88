// Picks the panel GEMMs' build for this CPU (panel_gemm.h), once.

#include <cstdlib>
#include <cstring>

#include "panel_gemm.h"

namespace ortinf {
namespace {

PanelKernels pick() {
  const char* cap = std::getenv("ORTINF_KERNEL_ISA");
  const auto capped = [cap](const char* name) { return cap != nullptr && std::strcmp(cap, name) == 0; };
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (!capped("avx2") && !capped("avxvnni") && !capped("generic") && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
  {
    const char* math = std::getenv("ORTINF_BF16_MATH");  // "bf16": vdpbf16ps (activations rounded); else fp32 arithmetic
#ifndef ORTINF_NO_BF16_DOT
    const bool dot = math != nullptr && std::strcmp(math, "bf16") == 0 && __builtin_cpu_supports("avx512bf16");
    if (dot) return PanelKernels{"avx512bf16", sgemm_avx512, bgemm_avx512, bgemm_dot_avx512bf16, to_bf16_avx512bf16};
#else
    (void)math;
#endif
    return PanelKernels{"avx512", sgemm_avx512, bgemm_avx512};
  }
  if (!capped("generic") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {"avx2", sgemm_avx2, bgemm_avx2};
#else
  (void)capped;
#endif
  return {"generic", sgemm_generic, bgemm_generic};
}

}  // namespace

const PanelKernels& panel_kernels() {
  static const PanelKernels kernels = pick();  // after every library's static initialisation
  return kernels;
}

}  // namespace ortinf
