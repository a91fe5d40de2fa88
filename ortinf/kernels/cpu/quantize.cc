// Weight quantization for the exporter (ortinf/exporter/quantize.py), called through ctypes: a weight W [K, N]
// (read through strides, so the checkpoint's [N, K] rows are read in place) into MatMulNBits' tensors, B
// [N, blocks, block * bits / 8] (offset binary; at 4 bits element 2j in byte j's low nibble, 2j + 1 in its high
// one) and scales [N, blocks], with the rules quantize.py's docstring states:
//
//   int8: scale = max|w| / 127, q = rint(w / scale) in -127..127
//   int4: scale = w* / -8, w* the block's first value of largest magnitude, q = rint(w / scale) in -8..7
//
// bit for bit what numpy computes there (IEEE division, round half to even: no -ffast-math in this unit), on
// every core: the 1.5B int4 export spent 20 of its 67 s in numpy's passes over the weights (issue 55).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

struct Job {
  const float* w;
  int64_t k, n, stride_k, stride_n;  // element (k, n) at w[k * stride_k + n * stride_n]
  int bits;
  int64_t block;
  uint8_t* b;
  float* scales;
};

// Round half to even for |x| < 2^22 (here |x| <= 127): adding and subtracting 1.5 * 2^23 leaves x rounded in the
// default rounding mode, as std::nearbyint does, but in two vectorisable adds where nearbyint is a libm call per
// value on the baseline x86-64 this unit is built for (no reassociation flags here, so the adds stay).
inline float round_even(float x) {
  constexpr float kMagic = 12582912.0f;
  return (x + kMagic) - kMagic;
}

// Columns [first, last) of the job; returns whether every value came back exactly from its code and scale.
bool quantize_columns(const Job& job, int64_t first, int64_t last) {
  const int64_t blocks = (job.k + job.block - 1) / job.block;
  const int64_t blob = job.block * job.bits / 8;
  const float low = job.bits == 8 ? -127.0f : -8.0f, high = job.bits == 8 ? 127.0f : 7.0f;
  const int offset = 1 << (job.bits - 1);
  const size_t size = static_cast<size_t>(job.block);
  std::vector<float> values(size), codes(size);
  int inexact = 0;
  for (int64_t n = first; n < last; ++n) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t start = blk * job.block, count = std::min(job.block, job.k - start);
      float* v = values.data();
      const float* column = job.w + start * job.stride_k + n * job.stride_n;
      if (job.stride_k == 1) {
        std::copy(column, column + count, v);
      } else {
        for (int64_t i = 0; i < count; ++i) v[i] = column[i * job.stride_k];
      }
      std::fill(v + count, v + job.block, 0.0f);  // zero past K: the padding quantize_weight adds
      float scale;
      if (job.bits == 8) {
        float amax = 0.0f;
        for (size_t i = 0; i < size; ++i) amax = std::max(amax, std::fabs(v[i]));
        scale = amax / 127.0f;
      } else {
        float amax = -1.0f, extreme = 0.0f;
        for (size_t i = 0; i < size; ++i)
          if (std::fabs(v[i]) > amax) {  // the first of the largest magnitude, as numpy's argmax picks
            amax = std::fabs(v[i]);
            extreme = v[i];
          }
        scale = extreme / -8.0f;
      }
      const float safe = scale == 0.0f ? 1.0f : scale;
      float* q = codes.data();
      for (size_t i = 0; i < size; ++i) {
        const float r = round_even(v[i] / safe);
        q[i] = r < low ? low : (r > high ? high : r);
        inexact |= q[i] * scale != v[i];
      }
      uint8_t* out = job.b + (n * blocks + blk) * blob;
      if (job.bits == 8) {
        for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(static_cast<int>(q[i]) + offset);
      } else {
        for (size_t i = 0; i < size / 2; ++i)
          out[i] = static_cast<uint8_t>((static_cast<int>(q[2 * i]) + offset) | ((static_cast<int>(q[2 * i + 1]) + offset) << 4));
      }
      job.scales[n * blocks + blk] = scale;
    }
  }
  return inexact == 0;
}

}  // namespace

extern "C" {

// Returns 1 when every weight is exactly its code times its scale (already on the grid: a Q8_0/Q4_0 GGUF's), 0 when
// not, -1 for arguments it refuses (quantize.py then takes the numpy route).
__attribute__((visibility("default"))) int ortinf_quantize_nbits(const float* w, int64_t k, int64_t n, int64_t stride_k,
                                                                 int64_t stride_n, int bits, int64_t block, uint8_t* b,
                                                                 float* scales, int threads) {
  if (w == nullptr || b == nullptr || scales == nullptr || k <= 0 || n <= 0 || (bits != 8 && bits != 4) || block <= 0 ||
      block % 2 != 0)
    return -1;
  const Job job{w, k, n, stride_k, stride_n, bits, block, b, scales};
  const int64_t count = std::max<int64_t>(1, std::min<int64_t>(threads > 0 ? threads : 1, n));
  std::vector<char> exact(static_cast<size_t>(count), 1);
  std::vector<std::thread> workers;
  for (int64_t t = 1; t < count; ++t)
    workers.emplace_back([&, t] { exact[static_cast<size_t>(t)] = quantize_columns(job, n * t / count, n * (t + 1) / count); });
  exact[0] = quantize_columns(job, 0, n / count);
  for (std::thread& worker : workers) worker.join();
  return std::all_of(exact.begin(), exact.end(), [](char e) { return e != 0; }) ? 1 : 0;
}

}  // extern "C"
