// The arithmetic of `ortinf.MoE` that is compiled once per instruction set (moe_{avx512,avx2,generic}.cc
// include moe_body.inc under their own -m flags; moe.cc picks one at load): the fp32 experts' GEMM.
// Quantized experts run on QMatMul's kernels (qmatmul_impl.h) with each expert's packed weights.
#pragma once

#include <cstdint>

namespace ortinf {

// out[m, n0:n1] = x[m, :] . w[:, n0:n1] (+ bias[n0:n1]) for rows m0 <= m < m1, n0 a multiple of 16;
// x [M, K] row-major (row stride K), out [M, N]. The weights come in panels of 16 columns: panel p holds
// columns 16p .. 16p + 15 as K rows of 16 floats, contiguous ([ceil(N / 16), K, 16], zero-padded), so
// a job streams its panels from memory front to back (a row-major [K, N] weight read 16 columns at a
// time strides N floats per row: a new page every few rows, which the prefetchers do not follow; the
// one-token step then ran at 2-3 GB/s). Rows go in groups of 4 against a panel, so each weight vector
// loaded serves 4 rows, and the one-token step reads each weight once (a GEMV at memory speed). A
// row's result does not depend on the rows beside it (the same loop order for each).
constexpr int64_t kPanel = 16;

struct SGemm {
  const float* x;
  const float* w;     // panels [ceil(N / 16), K, 16]
  const float* bias;  // [N] or null
  float* out;
  int64_t M, K, N;
};

using SgemmFn = void (*)(const SGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

void sgemm_avx512(const SGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void sgemm_avx2(const SGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
void sgemm_generic(const SGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);

}  // namespace ortinf
