// The panel GEMMs, compiled once per instruction set (panel_gemm_{avx512,avx2,generic}.cc include
// panel_gemm_body.inc under their own -m flags; panel_gemm.cc picks one at load): fp32 weights (ortinf.MoE's
// fp32 experts) and bf16 weights (ortinf.BMatMul, bmatmul.cc), with fp32 activations and accumulation.
// Quantized weights run on QMatMul's kernels (qmatmul_impl.h).
#pragma once

#include <cstdint>

namespace ortinf {

// out[m, n0:n1] = x[m, :] . w[:, n0:n1] (+ bias[n0:n1]) for rows m0 <= m < m1, n0 a multiple of 16;
// x [M, K] row-major (row stride K), out [M, N]. The weights come in panels of 16 columns: panel p holds
// columns 16p .. 16p + 15 as K rows of 16 values, contiguous ([ceil(N / 16), K, 16], zero-padded), so
// a job streams its panels from memory front to back (a row-major [K, N] weight read 16 columns at a
// time strides N values per row: a new page every few rows, which the prefetchers do not follow; the
// one-token step then ran at 2-3 GB/s). Rows go in groups of R against P panels side by side
// (panel_gemm_body.inc: 4 x 4 on AVX-512, 6 x 1 on AVX2), so each weight vector loaded serves R rows and R x P
// FMA chains run at once; fewer rows than R (a decode step) take several panels side by side, all rows against
// each loaded weight, so the weights are read once (a GEMV at memory speed). A
// row's result does not depend on the rows beside it (the same loop order for each). bf16 weights
// (the upper 16 bits of a float32) are widened to float32 in registers: exact, and half the bytes read.
constexpr int64_t kPanel = 16;

template <typename T>
struct PanelGemm {
  const float* x;
  const T* w;         // panels [ceil(N / 16), K, 16]
  const float* bias;  // [N] or null
  float* out;
  int64_t M, K, N;
  const uint16_t* xb = nullptr;  // x rounded to bf16 [M, K] (the bf16 dot-product path only)
};
using SGemm = PanelGemm<float>;
using BGemm = PanelGemm<uint16_t>;  // bf16 weights, as their bits

using SgemmFn = void (*)(const SGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
using BgemmFn = void (*)(const BGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

#define ORTINF_PANEL_GEMM_DECLARE(isa)                                              \
  void sgemm_##isa(const SGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1); \
  void bgemm_##isa(const BGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
ORTINF_PANEL_GEMM_DECLARE(avx512)
ORTINF_PANEL_GEMM_DECLARE(avx2)
ORTINF_PANEL_GEMM_DECLARE(generic)

// The widest build this CPU runs, capped by ORTINF_KERNEL_ISA as the attention's is (panel_gemm.cc).
// bf16 dot products (panel_gemm_avx512bf16.cc): activations rounded to bf16 (to_bf16, round to nearest even) into
// BGemm::xb, then vdpbf16ps; K even. Null where the CPU has no AVX512_BF16 (or ORTINF_KERNEL_ISA caps the pick).
using ToBf16Fn = void (*)(const float* x, uint16_t* out, int64_t count);
void bgemm_dot_avx512bf16(const BGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void to_bf16_avx512bf16(const float* x, uint16_t* out, int64_t count);

struct PanelKernels {
  const char* name;
  SgemmFn sgemm;
  BgemmFn bgemm;
  BgemmFn bgemm_dot = nullptr;
  ToBf16Fn to_bf16 = nullptr;
};
const PanelKernels& panel_kernels();

}  // namespace ortinf
