// Benchmark-only: oneDNN's matmul on the shapes of benchmarks/qmatmul.py, the route the kernel issue
// asked to measure beside ortinf.QMatMul (built by benchmarks/peers/install_onednn.sh against the
// `onednn` / `onednn-devel` wheels; never part of ortinf).
//
//   onednn_matmul M K N MODE GROUP REPEATS WEIGHTS  ->  prints "<median ms per matmul> <impl name>"
//
// MODE: f32 (f32 x f32), s8 / s4 (f32 activations x int8 / int4 weights with one f32 scale per GROUP
// rows of K and column, decompressed inside the matmul: fpmath strict applied to integers), s8s8
// (int8 x int8: activations quantized per token and per GROUP of K, the scales oneDNN's grouped
// source scales, as ortinf.QMatMul quantizes them; the activation quantization itself is not timed).
// WEIGHTS different weight tensors are run in turn so that one row reads its weights from memory.
// Weights are reordered once into the layout oneDNN picks (tag::any), as ortinf packs at export.

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace dnnl;
using dt = memory::data_type;
using tag = memory::format_tag;

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s M K N f32|s8|s4|s8s8 GROUP REPEATS WEIGHTS\n", argv[0]);
    return 2;
  }
  const memory::dim M = std::atol(argv[1]), K = std::atol(argv[2]), N = std::atol(argv[3]);
  const std::string mode = argv[4];
  const memory::dim G = std::atol(argv[5]);
  const int repeats = std::atoi(argv[6]), count = std::atoi(argv[7]);
  engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  std::mt19937 rng(0);
  std::normal_distribution<float> normal(0.f, 1.f);

  const bool int_src = mode == "s8s8";
  const dt wei_dt = mode == "f32" ? dt::f32 : mode == "s4" ? dt::s4 : dt::s8;
  memory::desc src_md({M, K}, int_src ? dt::s8 : dt::f32, tag::ab);
  memory::desc dst_md({M, N}, dt::f32, tag::ab);
  memory::desc wei_any({K, N}, wei_dt, tag::any);
  primitive_attr attr;
  if (mode != "f32") {
    attr.set_scales(DNNL_ARG_WEIGHTS, (1 << 0) | (1 << 1), {G, 1}, dt::f32);
    if (!int_src) attr.set_fpmath_mode(fpmath_mode::strict, true);
  }
  if (int_src) attr.set_scales(DNNL_ARG_SRC, (1 << 0) | (1 << 1), {1, G}, dt::f32);
  matmul::primitive_desc pd;
  try {
    pd = matmul::primitive_desc(eng, src_md, wei_any, dst_md, attr);
  } catch (const dnnl::error& e) {
    std::printf("unimplemented %s\n", e.what());
    return 0;
  }
  matmul mm(pd);

  std::vector<memory> weights, wscales;
  for (int i = 0; i < count; ++i) {
    memory plain({{K, N}, wei_dt, tag::ab}, eng);
    if (wei_dt == dt::f32) {
      float* p = static_cast<float*>(plain.get_data_handle());
      for (memory::dim j = 0; j < K * N; ++j) p[j] = normal(rng);
    } else {  // int4 packs two values per byte: random bytes are valid either way
      unsigned char* p = static_cast<unsigned char*>(plain.get_data_handle());
      const size_t bytes = plain.get_desc().get_size();
      for (size_t j = 0; j < bytes; ++j) p[j] = static_cast<unsigned char>(rng() % 255 + 1);
    }
    memory packed(pd.weights_desc(), eng);
    reorder(plain, packed).execute(strm, plain, packed);
    weights.push_back(packed);
    memory scales({{(K + G - 1) / G, N}, dt::f32, tag::ab}, eng);
    float* s = static_cast<float*>(scales.get_data_handle());
    for (memory::dim j = 0; j < (K + G - 1) / G * N; ++j) s[j] = 0.01f;
    wscales.push_back(scales);
  }
  memory src(src_md, eng), dst(dst_md, eng);
  if (int_src) {
    signed char* p = static_cast<signed char*>(src.get_data_handle());
    for (memory::dim j = 0; j < M * K; ++j) p[j] = static_cast<signed char>(static_cast<int>(rng() % 255) - 127);
  } else {
    float* p = static_cast<float*>(src.get_data_handle());
    for (memory::dim j = 0; j < M * K; ++j) p[j] = normal(rng);
  }
  memory src_scales({{M, (K + G - 1) / G}, dt::f32, tag::ab}, eng);
  std::fill_n(static_cast<float*>(src_scales.get_data_handle()), M * ((K + G - 1) / G), 0.02f);

  {  // a reference implementation (seconds per call) is reported from one call
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights[0]}, {DNNL_ARG_DST, dst}};
    if (mode != "f32") args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] = wscales[0];
    if (int_src) args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] = src_scales;
    const auto start = std::chrono::steady_clock::now();
    mm.execute(strm, args);
    strm.wait();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (ms > 200.0) {
      std::printf("%.4f %s\n", ms, pd.impl_info_str());
      return 0;
    }
  }
  std::vector<double> times;
  for (int r = -2; r < repeats; ++r) {  // two warm-up rounds
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < count; ++i) {
      std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights[i]}, {DNNL_ARG_DST, dst}};
      if (mode != "f32") args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] = wscales[i];
      if (int_src) args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC] = src_scales;
      mm.execute(strm, args);
    }
    strm.wait();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / count;
    if (r >= 0) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  std::printf("%.4f %s\n", times[times.size() / 2], pd.impl_info_str());
  return 0;
}
