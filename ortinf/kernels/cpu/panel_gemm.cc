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
#ifndef ORTINF_NO_BF16_DOT  // vdpbf16ps for BMatMul under bf16 math (bmatmul.cc); ORTINF_KERNEL_ISA=avx512 leaves it out
    if (!capped("avx512") && __builtin_cpu_supports("avx512bf16"))
      return PanelKernels{"avx512bf16", sgemm_avx512, bgemm_avx512, bgemm_dot_avx512bf16, to_bf16_avx512bf16};
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
