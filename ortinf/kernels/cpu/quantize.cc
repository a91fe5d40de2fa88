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

// Columns [first, last) of the job; returns whether every value came back exactly from its code and scale.
bool quantize_columns(const Job& job, int64_t first, int64_t last) {
  const int64_t blocks = (job.k + job.block - 1) / job.block;
  const int64_t blob = job.block * job.bits / 8;
  const int low = job.bits == 8 ? -127 : -8, high = job.bits == 8 ? 127 : 7, offset = 1 << (job.bits - 1);
  std::vector<float> values(static_cast<size_t>(job.block));
  bool exact = true;
  for (int64_t n = first; n < last; ++n) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t start = blk * job.block;
      for (int64_t i = 0; i < job.block; ++i) {  // zero past K: the padding quantize_weight adds
        const int64_t k = start + i;
        values[static_cast<size_t>(i)] = k < job.k ? job.w[k * job.stride_k + n * job.stride_n] : 0.0f;
      }
      float scale;
      if (job.bits == 8) {
        float amax = 0.0f;
        for (float v : values) amax = std::max(amax, std::fabs(v));
        scale = amax / 127.0f;
      } else {
        float amax = -1.0f, extreme = 0.0f;
        for (float v : values)
          if (std::fabs(v) > amax) {  // the first of the largest magnitude, as numpy's argmax picks
            amax = std::fabs(v);
            extreme = v;
          }
        scale = extreme / -8.0f;
      }
      const float safe = scale == 0.0f ? 1.0f : scale;
      uint8_t* out = job.b + (n * blocks + blk) * blob;
      for (int64_t i = 0; i < job.block; ++i) {
        const float v = values[static_cast<size_t>(i)];
        const float r = std::nearbyint(v / safe);
        const int q = static_cast<int>(std::min<float>(std::max<float>(r, static_cast<float>(low)), static_cast<float>(high)));
        exact = exact && static_cast<float>(q) * scale == v;
        const uint8_t code = static_cast<uint8_t>(q + offset);
        if (job.bits == 8) {
          out[i] = code;
        } else if (i % 2 == 0) {
          out[i / 2] = code;
        } else {
          out[i / 2] = static_cast<uint8_t>(out[i / 2] | (code << 4));
        }
      }
      job.scales[n * blocks + blk] = scale;
    }
  }
  return exact;
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
