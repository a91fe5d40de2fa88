// The arithmetic of ortinf's quantized MatMul (`ortinf.QMatMul`), free of ONNX Runtime types so that
// it compiles once per instruction set (qmatmul_{avx512vnni,avxvnni,avx2,generic}.cc include
// qmatmul_body.inc under their own -m flags) and is chosen at run time (qmatmul.cc).
//
// Y[M, N] = A[M, K] x W[K, N] with W quantized at export (int8 or int4, symmetric, one float scale
// per block of `block` rows of K and per column) and A quantized here, per call, per token and per
// the same blocks of K: row m, block b gets its own scale max|a| / 127. A row's scale depends on that
// row alone, so one token's outliers never coarsen another request's rows, and a row's result does
// not depend on which rows share its call (batch invariant: the tests check it bit for bit).
//
// Per (row, block) the int8 x int8 (or int4) products are summed exactly in int32 and then scaled:
//
//   Y[m, n] = sum_b  xscale[m, b] * wscale[b, n] * sum_{k in b} xq[m, k] * wq[k, n]
//
// The packed weight layout (ortinf/exporter/quantize.py writes it): columns in tiles of 16, zero-padded to
// a whole tile; K zero-padded to a whole number of blocks (Kp). Within a tile, groups of 4 rows of K:
//
//   int8: tile t = Kp * 16 bytes;  group g (rows 4g..4g+3) = 64 bytes: byte 4c + i = wq[4g + i, 16t + c] + 128
//   int4: tile t = Kp * 8 bytes;   groups 2p and 2p+1 share 64 bytes: byte 4c + i holds group 2p's value
//         in its low nibble and group 2p+1's in its high nibble, each wq + 8 (wq in -8..7)
//
// so one 64-byte load feeds `vpdpbusd` (u8 x s8, four products per int32 lane) for 16 columns x 4
// rows of K, with the activation's 4 bytes broadcast to every lane. The weights are offset-binary
// (unsigned): the instruction's u8 operand. The activations are the s8 operand, so the sum carries
// an excess of offset * sum(xq) per block, subtracted once per block from an exact per-row sum
// (xsum). AVX2 without VNNI has `vpmaddubsw`, whose 16-bit pair sums would saturate on u8 weights up
// to 255: its int8 path uses the sign trick instead (|x| as u8, w with x's sign as s8: |pair| <=
// 2 * 127 * 127 < 32768), its int4 path the same u8 x s8 order as VNNI (15 * 127 * 2 fits). Weights
// never hold -128 (int8 scales are max|w| / 127), so the sign trick cannot overflow.
//
// Scales are per tile and block: wscale [tiles, blocks, 16] float.
#pragma once

#include <cstdint>

namespace ortinf {

constexpr int64_t kTile = 16;  // columns per packed tile
constexpr int kMaxParts = 3;   // projections of one A in one call (q, k and v)

// One call computing several projections of the same A (a layer's q, k and v; its gate and up): part p's
// weights are packed as tiles of their own, one after another, and tile t's 16 columns go to part part[t]'s
// output from its column col[t]. With `swiglu` there are two parts of equal N whose tiles alternate (tile 2j:
// gate columns 16j.., tile 2j+1: up's), and the one output is silu(gate) * up: the MLP's activation is
// applied while the pair's results are still in registers, and neither product is written to memory.
struct QParts {
  float* out[kMaxParts];
  int64_t N[kMaxParts];
  const float* bias[kMaxParts];  // each [N[p]] or null
  const int32_t* part;           // [tiles]
  const int64_t* col;            // [tiles]
  bool swiglu;
};

struct QGemm {
  const int8_t* xq;      // [M, Kp] activations, quantized per row and block
  const float* xscale;   // [M, blocks]
  const int32_t* xsum;   // [M, blocks]: sum of the block's xq
  const uint8_t* w;      // packed weights (layout above)
  const float* wscale;   // [tiles, blocks, 16]
  const float* bias;     // [N] or null
  float* out;            // [M, N]
  int64_t M, N, Kp, blocks, block, bits;
  const QParts* parts = nullptr;  // null: one projection, out [M, N] (the tiles in column order)
  // Tiles side by side in memory: a group of `group` tiles stores its tiles' 64-byte lines in turn (line L of each,
  // then line L + 1) and its scales block by block (block b of each, then b + 1), so a micro kernel reading the
  // group's tiles together reads one stream of weights and one of scales. Two streams a tile apart (12 KB at
  // K = 1,536) read ~25% slower than one on the EPYC (issue 43, docs/performance.md). 1: the tiles one after
  // another (the layout above; packages before issue 43 store it, and the MoE op's experts).
  int64_t group = 1;
};

// Quantizes rows [m0, m1) of a [M, K] (row stride lda) into g's xq/xscale/xsum (K padded to Kp with zeros).
using QuantizeFn = void (*)(const float* a, int64_t lda, int64_t K, const QGemm& g, int64_t m0, int64_t m1);
// Computes out[m0:m1, tiles t0..t1) (bias added).
using GemmFn = void (*)(const QGemm& g, int64_t m0, int64_t m1, int64_t t0, int64_t t1);

#define ORTINF_QMATMUL_DECLARE(isa)                                                              \
  void quantize_rows_##isa(const float* a, int64_t lda, int64_t K, const QGemm& g, int64_t m0, int64_t m1); \
  void qgemm_##isa(const QGemm& g, int64_t m0, int64_t m1, int64_t t0, int64_t t1); \
  int64_t qgemm_group_##isa();

// The build QMatMul runs with (picked and checked at load, qmatmul.cc); ortinf.MoE's quantized experts use it too.
struct QKernels {
  const char* name;
  QuantizeFn quantize;
  GemmFn gemm;
  int64_t group;  // the tiles a micro kernel reads side by side (its build's kCols): the packing's best group
};
const QKernels& qmatmul_kernels();

ORTINF_QMATMUL_DECLARE(avx512vnni)
ORTINF_QMATMUL_DECLARE(avxvnni)
ORTINF_QMATMUL_DECLARE(avx2)
ORTINF_QMATMUL_DECLARE(generic)

}  // namespace ortinf
