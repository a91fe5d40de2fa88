// BMatMul on bf16 dot products (vdpbf16ps, AVX512_BF16): activations rounded to bf16 once per call (as PyTorch's bf16
// inference rounds them), two k at a time against the checkpoint's bf16 weights, fp32 accumulation. Twice the
// multiply rate of widening the weights to fp32 (panel_gemm_body.inc), for prefill and batches, where the GEMM is
// compute-bound. Flags: ortinf/kernels/build.py (the avx512 set and -mavx512bf16); picked by panel_gemm.cc where
// the CPU has AVX512_BF16, and run by BMatMul under bf16 math (the default; bmatmul.cc's header).
//
// The panels are the widening path's ([ceil(N / 16), K, 16]): rows k and k + 1 of a panel are 64 contiguous bytes,
// one load, interleaved by one vpermw into the pairs vdpbf16ps reads (column c's w[k], w[k + 1] in dword c). The
// activation pair (x[k], x[k + 1]) is one dword, broadcast. R rows x P panels of accumulators share each permuted
// weight vector; a row's sums run in the same order whatever R is (a row's result does not depend on its
// neighbours, as on the other paths).

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "panel_gemm.h"

namespace ortinf {
namespace {

constexpr int kRows = 4, kPanels = 4;  // 16 zmm accumulators, 4 permuted weights, broadcasts

alignas(64) const uint16_t kInterleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                              8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// A job's K in chunks of kChunkPairs pairs: a group of P panels over one chunk (4 panels x 2,048 values: 256 KB) stays
// in L2 while every row group of the job passes over it. Unchunked, a 16-row step re-read a down projection's panels
// (4 x 8,960 values: 1.1 MB, over L2) from memory once per group of 4 rows. Between chunks a row's sums wait in `out`
// as float32 and are loaded back: the same vdpbf16ps sequence, so the same bits as one pass over K.
constexpr int64_t kChunkPairs = 1024;

template <int R, int P>
inline void block(const BGemm& g, int64_t m, int64_t panel, int64_t k2_begin, int64_t k2_end) {
  const bool first = k2_begin == 0, last = k2_end == g.K / 2;
  __mmask16 valid[P];
  for (int p = 0; p < P; ++p) {
    const int64_t count = std::min<int64_t>(kPanel, g.N - (panel + p) * kPanel);
    valid[p] = static_cast<__mmask16>((1u << count) - 1);
  }
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p)
      acc[r][p] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid[p], g.out + (m + r) * g.N + (panel + p) * kPanel);
  const __m512i order = _mm512_load_si512(kInterleave);
  const uint16_t* w[P];
  for (int p = 0; p < P; ++p) w[p] = g.w + (panel + p) * g.K * kPanel;
  const uint32_t* x[R];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const uint32_t*>(g.xb + (m + r) * g.K);
  for (int64_t k2 = k2_begin; k2 < k2_end; ++k2) {
    __m512bh wv[P];
    for (int p = 0; p < P; ++p)
      wv[p] = (__m512bh)_mm512_permutexvar_epi16(order, _mm512_loadu_si512(w[p] + k2 * 2 * kPanel));
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r][k2]));
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], xv, wv[p]);
    }
  }
  for (int p = 0; p < P; ++p) {
    const int64_t n = (panel + p) * kPanel;
    const __m512 bias = last && g.bias != nullptr ? _mm512_maskz_loadu_ps(valid[p], g.bias + n) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r)
      _mm512_mask_storeu_ps(g.out + (m + r) * g.N + n, valid[p], last && g.bias != nullptr ? _mm512_add_ps(acc[r][p], bias) : acc[r][p]);
  }
}

// Fewer rows take more panels side by side (a decode step): enough independent vdpbf16ps chains to cover its
// latency, each permuted weight vector still shared by every row.
template <int R>
constexpr int panels_for() {
  return R == 1 ? 8 : R == 2 ? 6 : R == 3 ? 5 : kPanels;
}

template <int R>
void rows(const BGemm& g, int64_t m, int64_t first, int64_t last, int64_t k2_begin, int64_t k2_end) {
  constexpr int P = panels_for<R>();
  int64_t panel = first;
  for (; panel + P <= last; panel += P) block<R, P>(g, m, panel, k2_begin, k2_end);
  for (; panel < last; ++panel) block<R, 1>(g, m, panel, k2_begin, k2_end);
}

}  // namespace

void bgemm_dot_avx512bf16(const BGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  const int64_t first = n0 / kPanel, last = (n1 + kPanel - 1) / kPanel, pairs = g.K / 2;
  for (int64_t k2 = 0; k2 < pairs; k2 += kChunkPairs) {
    const int64_t k2_end = std::min(pairs, k2 + kChunkPairs);
    int64_t m = m0;
    for (; m + kRows <= m1; m += kRows) rows<kRows>(g, m, first, last, k2, k2_end);
    switch (m1 - m) {  // the rows left, each alone: the same sums as in a block of four
      case 3: rows<3>(g, m, first, last, k2, k2_end); break;
      case 2: rows<2>(g, m, first, last, k2, k2_end); break;
      case 1: rows<1>(g, m, first, last, k2, k2_end); break;
      default: break;
    }
  }
}

void to_bf16_avx512bf16(const float* x, uint16_t* out, int64_t count) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16)  // round to nearest even, as PyTorch's float -> bfloat16
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
  if (i < count) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (count - i)) - 1);
    _mm256_mask_storeu_epi16(out + i, tail, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail, x + i)));
  }
}

}  // namespace ortinf
