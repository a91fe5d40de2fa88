// The custom op `ortinf.QMatMul`: Y = A x W with W's int8 or int4 weights packed at export
// (ortinf/exporter/quantize.py) and A quantized here per token and per block of K (qmatmul_impl.h has
// the layout and the arithmetic).
//
//   A [..., K] f32, weight u8, scales f32, bias [N] f32 (optional)
//   K, N, bits (8 or 4), block_size, layout (int attributes)
//   -> Y [..., N] f32
//
// Parts (layout 1 only): one node computes up to 3 projections of the same A (a layer's q, k and v), so a
// one-token step quantizes A once, runs one node instead of three and one parallel loop over all their
// columns (the small k and v projections alone left a thread idle at their edges). Attributes N1, N2 give
// parts 1 and 2 their widths, and inputs 4-6 and 7-9 their weight, scales and bias, as inputs 1-3 are part
// 0's; output p is part p's [..., N_p]. `activation` 1 (swiglu) takes two parts of equal width, gate and
// up, and has one output, silu(gate) * up (qmatmul_impl.h, QParts): an MLP's first half in one node.
// ortinf/exporter/cpu_fusion.py writes these nodes.
//
// Residual (input 10, optional, one part without activation): Y = A x W (+ bias) + residual, the layer's residual Add
// taken into the projection that feeds it (the output and down projections): each job adds the residual's rows to
// the columns it wrote while they are in cache, and the step runs one node fewer. The residual holds M x N values; Y
// takes its shape where it has more axes than A's [..., N] (the Add's broadcast shape, [1, T, N] for a [T, K] A).
//
// `layout` says how the weight inputs are stored:
//   0 (packages before issue 42): packed_weight [bytes] in this op's layout, scales [tiles, blocks, 16];
//   1: MatMulNBits' tensors, B [N, blocks, block * bits / 8] offset binary and scales [N * blocks], the
//      very initializers model.onnx's MatMulNBits reads, so a package holds its weights once
//      (docs/exporter.md, "One weight file"). They must be constant: the kernel packs them into its
//      own layout when it is created and hands the source pages back to the OS (release_mapped).
//
// Why an op of ortinf's own and not ORT's MatMulNBits: on the CPUs this runs on, MatMulNBits'
// int8-activation path (accuracy level 4) leaves VNNI's integer throughput unused for int8 weights
// and pays a per-call repack of the activations into its own blocked layout (the kernel issue's
// notes: 1.7-2.5x slower than a u8s8 GEMM on an AVX-512 VNNI EPYC), and DynamicQuantizeMatMul scales
// the activations per tensor, so one outlier token coarsens every row of the step. Here the
// activation scale is per token and block, and the weights sit in the layout the dot-product
// instructions read (no repack per call).
//
// Threads: the activation rows are quantized (in parallel when there are many), then jobs of up to
// 64 rows x 4 tiles (64 columns) run on ORT's intra-op pool through KernelContext_ParallelFor. A
// job's weights (K x 64 bytes at int8) stay in L2 while its row groups pass over them.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mapped_pages.h"
#include "packed_store.h"
#include "ort_glue.h"
#include "qmatmul_impl.h"

namespace ortinf {
namespace {

constexpr int64_t kJobRows = 64, kJobTiles = 4, kQuantizeRows = 16;
constexpr size_t kResidual = 1 + 3 * kMaxParts;  // the residual's input index

struct Isa {
  const char* name;
  QuantizeFn quantize;
  GemmFn gemm;
  int64_t group;  // tiles its micro kernel reads side by side: the group layout-1 weights are packed in
};

// The widest build this CPU runs. ORTINF_KERNEL_ISA caps it (never raises it): avx2 leaves out both
// VNNI builds, avxvnni the AVX-512 one, generic everything; the tests run every build the machine can.
Isa pick_isa() {
  const char* cap = std::getenv("ORTINF_KERNEL_ISA");
  const auto capped = [cap](const char* name) { return cap != nullptr && std::strcmp(cap, name) == 0; };
  const bool no512 = capped("avx2") || capped("avxvnni") || capped("generic");
  const bool no_vnni256 = capped("avx2") || capped("generic");
  const bool no256 = capped("generic");
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (!no512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
    return {"avx512vnni", quantize_rows_avx512vnni, qgemm_avx512vnni, qgemm_group_avx512vnni()};
  if (!no256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    // AVX-VNNI is CPUID leaf 7, sub-leaf 1, EAX bit 4 (GCC 12's __builtin_cpu_supports does not know it)
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    if (!no_vnni256 && (a & (1u << 4))) return {"avxvnni", quantize_rows_avxvnni, qgemm_avxvnni, qgemm_group_avxvnni()};
    return {"avx2", quantize_rows_avx2, qgemm_avx2, qgemm_group_avx2()};
  }
#else
  (void)no512, (void)no_vnni256, (void)no256;
#endif
  return {"generic", quantize_rows_generic, qgemm_generic, qgemm_group_generic()};
}

// Whether `isa` computes what the portable build computes, on a small problem with every feature a
// call has (two blocks, a ragged last tile, rows in groups and alone, int8 and int4). A build this
// project's test machines cannot run (the AVX-512 VNNI one, on an AVX2-only CI) is checked here on
// the first machine that runs it: a mismatch falls back to the next build and says so, instead of
// serving wrong numbers.
bool agrees_with_generic(const Isa& isa) {
  constexpr int64_t K = 64, N = 20, M = 5, kBlock = 32, kBlocks = 2, kTiles = 2;
  uint32_t state = 12345u;
  const auto next = [&state]() { return (state = state * 1664525u + 1013904223u) >> 8; };
  float a[M * K], scales[kTiles * kBlocks * kTile], want[M * N], got[M * N];
  for (float& v : a) v = static_cast<float>(static_cast<int>(next() % 2001) - 1000) / 250.f;
  for (float& v : scales) v = static_cast<float>(next() % 1000 + 1) / 4096.f;
  for (int64_t bits : {8, 4})
  for (int64_t group : {1, 2}) {  // the tiles one after another, and side by side (qmatmul_impl.h)
    std::vector<uint8_t> w(static_cast<size_t>(kTiles * K * kTile * bits / 8));
    for (uint8_t& byte : w) byte = static_cast<uint8_t>(bits == 8 ? next() % 255 + 1 : next() % 256);  // int8 never -128
    for (const Isa* run : {&isa, static_cast<const Isa*>(nullptr)}) {
      std::vector<int8_t> xq(M * K);
      std::vector<float> xscale(M * kBlocks);
      std::vector<int32_t> xsum(M * kBlocks);
      float* out = run != nullptr ? got : want;
      const QGemm g{xq.data(), xscale.data(), xsum.data(), w.data(), scales, nullptr, out, M, N, K, kBlocks, kBlock, bits,
                    nullptr, group};
      (run != nullptr ? run->quantize : quantize_rows_generic)(a, K, K, g, 0, M);
      (run != nullptr ? run->gemm : qgemm_generic)(g, 0, M, 0, kTiles);
    }
    for (int64_t i = 0; i < M * N; ++i)
      if (!(std::fabs(got[i] - want[i]) <= 1e-4f * (1.f + std::fabs(want[i])))) return false;
  }
  return true;
}

Isa checked_isa() {
  Isa isa = pick_isa();
  if (std::strcmp(isa.name, "generic") == 0 || agrees_with_generic(isa)) return isa;
  std::fprintf(stderr, "ortinf: the %s build of QMatMul disagrees with the portable one on this CPU; using avx2/generic "
               "instead (please report this)\n", isa.name);
  Isa avx2{"avx2", quantize_rows_avx2, qgemm_avx2, qgemm_group_avx2()};
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (std::strcmp(isa.name, "avx2") != 0 && __builtin_cpu_supports("avx2") && agrees_with_generic(avx2)) return avx2;
#endif
  return {"generic", quantize_rows_generic, qgemm_generic, qgemm_group_generic()};
}

const Isa g_isa = checked_isa();

struct Owned {  // a kernel's own packed copy
  PackedBuffer<uint8_t> tiles;
  PackedBuffer<float> scales;
};

struct Kernel {
  int64_t K = 0, N = 0, bits = 0, block = 0;
  int64_t Kp = 0, blocks = 0, tiles = 0;  // tiles: of every part
  // layout 1: the weights in this op's tiles (region 0) and their scales (region 1), packed at creation or mapped
  // from the package's packed store (packed_store.h); no owner for layout 0, which reads its inputs at every call
  Packed packed;
  // parts (N[0] = N) and where each tile's columns go (QParts); one part and no activation: column order
  int64_t parts = 1, widths[kMaxParts] = {0, 0, 0};
  bool swiglu = false;
  std::vector<int32_t> tile_part;
  std::vector<int64_t> tile_col;

  int64_t group = 1;  // layout 1: g_isa.group (qmatmul_impl.h); the tile count is padded to whole groups
  int64_t tile_bytes() const { return bits == 8 ? Kp * kTile : Kp * kTile / 2; }
  int64_t padded_tiles() const { return (tiles + group - 1) / group * group; }
  // packed tile t's line L (64 bytes: 4 rows of K at int8, 8 at int4) and block b's 16 scales
  // (written only while packing, into the kernel's own buffers)
  uint8_t* line(int64_t t, int64_t L) const {
    return static_cast<uint8_t*>(const_cast<void*>(packed.region[0])) + (t - t % group) * tile_bytes() + (L * group + t % group) * 64;
  }
  float* block_scales(int64_t t, int64_t b) const {
    return static_cast<float*>(const_cast<void*>(packed.region[1])) + ((t - t % group) * blocks + b * group + t % group) * kTile;
  }
  size_t tiles_bytes() const { return static_cast<size_t>(padded_tiles() * tile_bytes()); }
  size_t scales_bytes() const { return static_cast<size_t>(padded_tiles() * blocks * kTile) * sizeof(float); }
  // what the packed store knows this kernel's tiles by (with the weight's offset in its file)
  std::string store_key() const {
    return "QMatMul/1 K=" + std::to_string(K) + " N=" + std::to_string(widths[0]) + "," + std::to_string(widths[1]) + "," +
           std::to_string(widths[2]) + " bits=" + std::to_string(bits) + " block=" + std::to_string(block) +
           " swiglu=" + std::to_string(swiglu) + " group=" + std::to_string(group);
  }
  // the packed tile that holds part p's local tile j
  int64_t tile_of(int64_t p, int64_t j) const {
    if (swiglu) return 2 * j + p;
    int64_t first = 0;
    for (int64_t q = 0; q < p; ++q) first += (widths[q] + kTile - 1) / kTile;
    return first + j;
  }
};

// MatMulNBits' B (column n's Kp values as offset-binary bytes, int4: element 2j in byte j's low nibble,
// 2j+1 in its high one) and scales [N, blocks] -> this op's tiles (qmatmul_impl.h). Both forms hold
// the same offset-binary values, so this moves bytes and nibbles only. A padding column holds the
// offset (a zero weight), as quantize.py's packing writes it.
void pack_nbits(Kernel* k, int64_t part, const uint8_t* b, const float* s) {
  const int64_t column_bytes = k->Kp * k->bits / 8, tile_bytes = k->tile_bytes(), N = k->widths[part];
  pack_in_parallel((N + kTile - 1) / kTile, [&](int64_t first, int64_t last) {
  for (int64_t j = first; j < last; ++j) {  // the part's own tile j (columns 16j..) is packed tile t
    const int64_t t = k->tile_of(part, j);
    if ((j + 1) * kTile > N) {  // the ragged last tile: zero weights (the offset) and scales where no column is
      for (int64_t L = 0; L < tile_bytes / 64; ++L) std::memset(k->line(t, L), k->bits == 8 ? 128 : 0x88, 64);
      for (int64_t blk = 0; blk < k->blocks; ++blk) std::fill(k->block_scales(t, blk), k->block_scales(t, blk) + kTile, 0.f);
    }
    for (int64_t c = 0; c < kTile && j * kTile + c < N; ++c) {
      const int64_t n = j * kTile + c;
      const uint8_t* col = b + n * column_bytes;
      if (k->bits == 8) {  // line g (rows 4g..4g+3) of column c: bytes 4c .. 4c + 3, in K order
        for (int64_t g = 0; g < k->Kp / 4; ++g) std::memcpy(k->line(t, g) + 4 * c, col + 4 * g, 4);
      } else {  // rows 8p..8p+7 (bytes 4p..4p+3 of the column): line p, byte 4c + i = row 8p+i | row 8p+4+i << 4
        for (int64_t p = 0; p < k->Kp / 8; ++p) {
          const uint8_t* in = col + 4 * p;
          uint8_t* out = k->line(t, p) + 4 * c;
          out[0] = static_cast<uint8_t>((in[0] & 0x0F) | (in[2] << 4));
          out[1] = static_cast<uint8_t>((in[0] >> 4) | (in[2] & 0xF0));
          out[2] = static_cast<uint8_t>((in[1] & 0x0F) | (in[3] << 4));
          out[3] = static_cast<uint8_t>((in[1] >> 4) | (in[3] & 0xF0));
        }
      }
      for (int64_t blk = 0; blk < k->blocks; ++blk) k->block_scales(t, blk)[c] = s[n * k->blocks + blk];
    }
  }
  });
}

// Layout 1: part p's constant B and scales (inputs 1 + 3p, 2 + 3p), their types and sizes checked.
OrtStatus* constant_inputs(const OrtKernelInfo* info, const Kernel* k, int64_t part, void* data[2]) {
  const OrtValue* values[2] = {nullptr, nullptr};
  for (size_t i = 0; i < 2; ++i) {
    int constant = 0;
    RETURN_IF_ERROR(g_api->KernelInfoGetConstantInput_tensor(info, 3 * part + i + 1, &constant, &values[i]));
    if (!constant || values[i] == nullptr)
      return fail("QMatMul: with layout 1 the weight and scales must be constant initializers");
  }
  const int64_t N = k->widths[part];
  const int64_t want[2] = {N * k->Kp * k->bits / 8, N * k->blocks};
  const ONNXTensorElementDataType types[2] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
  for (size_t i = 0; i < 2; ++i) {
    OrtTensorTypeAndShapeInfo* shape = nullptr;
    RETURN_IF_ERROR(g_api->GetTensorTypeAndShape(values[i], &shape));
    size_t count = 0;
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    OrtStatus* status = g_api->GetTensorShapeElementCount(shape, &count);
    if (status == nullptr) status = g_api->GetTensorElementType(shape, &type);
    g_api->ReleaseTensorTypeAndShapeInfo(shape);
    RETURN_IF_ERROR(status);
    if (type != types[i] || static_cast<int64_t>(count) != want[i])
      return fail(i == 0 ? "QMatMul: B must be uint8 [N, blocks, block_size * bits / 8] (MatMulNBits' layout)"
                         : "QMatMul: scales must be float32 [N * blocks] (MatMulNBits' layout)");
    RETURN_IF_ERROR(g_api->GetTensorMutableData(const_cast<OrtValue*>(values[i]), &data[i]));
  }
  return nullptr;
}

struct Job {
  int64_t m0, m1, t0, t1;
};

struct Call {
  QGemm g;
  const float* a;
  int64_t K;
  std::vector<Job> jobs;
  const float* residual = nullptr;  // [M, N] or null
};

void quantize_one(void* data, size_t index) {
  const Call* call = static_cast<const Call*>(data);
  const int64_t m0 = static_cast<int64_t>(index) * kQuantizeRows;
  g_isa.quantize(call->a, call->K, call->K, call->g, m0, std::min(call->g.M, m0 + kQuantizeRows));
}

void gemm_one(void* data, size_t index) {
  const Call* call = static_cast<const Call*>(data);
  const Job& job = call->jobs[index];
  g_isa.gemm(call->g, job.m0, job.m1, job.t0, job.t1);
  if (call->residual != nullptr) add_residual(call->g.out, call->residual, call->g.N, job.m0, job.m1, job.t0 * kTile, job.t1 * kTile);
}

OrtStatus* compute(const Kernel& k, OrtKernelContext* context) {
  size_t given = 0;
  RETURN_IF_ERROR(g_api->KernelContext_GetInputCount(context, &given));
  const size_t inputs = static_cast<size_t>(1 + 3 * k.parts);
  Tensor t[kResidual + 1];
  for (size_t i = 0; i < given; ++i) {
    if (i >= inputs && i != kResidual) continue;
    const OrtValue* value = nullptr;
    RETURN_IF_ERROR(g_api->KernelContext_GetInput(context, i, &value));
    if (value == nullptr) {
      if (i < 3) return fail("QMatMul: a required input is missing");
      continue;
    }
    RETURN_IF_ERROR(read_input(context, i, &t[i]));
  }
  const Tensor& a = t[0];
  if (a.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || a.shape.empty() || a.shape.back() != k.K)
    return fail("QMatMul: A must be float32 [..., K] with K = " + std::to_string(k.K));
  const void* weights = k.packed.region[0];
  const void* weight_scales = k.packed.region[1];
  if (!k.packed.owner) {  // layout 0: the inputs are the packed form
    const Tensor &packed = t[1], &scales = t[2];
    if (packed.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 || packed.size() != k.tiles * k.tile_bytes())
      return fail("QMatMul: packed_weight must be uint8 with " + std::to_string(k.tiles * k.tile_bytes()) + " bytes");
    if (scales.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || scales.size() != k.tiles * k.blocks * kTile)
      return fail("QMatMul: scales must be float32 [tiles, blocks, 16]");
    weights = packed.data;
    weight_scales = scales.data;
  }
  QParts parts{};
  const int64_t outputs = k.swiglu ? 1 : k.parts;
  for (int64_t p = 0; p < k.parts; ++p) {
    const Tensor& bias = t[3 + 3 * p];
    if (bias.data != nullptr && (bias.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || bias.size() != k.widths[p]))
      return fail("QMatMul: bias " + std::to_string(p) + " must be float32 [" + std::to_string(k.widths[p]) + "]");
    parts.bias[p] = static_cast<const float*>(bias.data);
    parts.N[p] = k.widths[p];
    if (p >= outputs) continue;
    std::vector<int64_t> out_shape = a.shape;
    out_shape.back() = k.widths[p];
    const Tensor& residual = t[kResidual];
    if (residual.data != nullptr) {
      if (k.parts > 1 || k.swiglu || residual.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || residual.shape.empty() ||
          residual.shape.back() != k.N || residual.size() != a.size() / k.K * k.N)
        return fail("QMatMul: the residual must be float32 [..., N] with A's rows (one part, no activation)");
      if (residual.shape.size() > out_shape.size()) out_shape = residual.shape;
    }
    OrtValue* output = nullptr;
    RETURN_IF_ERROR(g_api->KernelContext_GetOutput(context, p, out_shape.data(), out_shape.size(), &output));
    RETURN_IF_ERROR(g_api->GetTensorMutableData(output, reinterpret_cast<void**>(&parts.out[p])));
  }
  const int64_t M = a.size() / k.K;
  if (M == 0) return nullptr;
  parts.part = k.tile_part.data();
  parts.col = k.tile_col.data();
  parts.swiglu = k.swiglu;

  std::vector<int8_t> xq(static_cast<size_t>(M * k.Kp));
  std::vector<float> xscale(static_cast<size_t>(M * k.blocks));
  std::vector<int32_t> xsum(static_cast<size_t>(M * k.blocks));
  Call call{{xq.data(), xscale.data(), xsum.data(), static_cast<const uint8_t*>(weights),
             static_cast<const float*>(weight_scales), parts.bias[0], parts.out[0], M, k.N, k.Kp, k.blocks,
             k.block, k.bits, k.tile_part.empty() ? nullptr : &parts, k.packed.owner ? k.group : 1},
            static_cast<const float*>(a.data), k.K, {}, static_cast<const float*>(t[kResidual].data)};
  const int64_t quantize_jobs = (M + kQuantizeRows - 1) / kQuantizeRows;
  if (quantize_jobs > 1) {
    RETURN_IF_ERROR(g_api->KernelContext_ParallelFor(context, quantize_one, static_cast<size_t>(quantize_jobs), 0, &call));
  } else {
    quantize_one(&call, 0);
  }
  // kJobTiles is even: a swiglu pair (tiles 2j, 2j + 1) never straddles two jobs. Tile-major: the jobs of one group of
  // tiles follow each other, so its weights are read from memory once and stay in L2 while every row chunk passes
  // over them (row-major jobs read all the weights again for each chunk of rows: 8 times at 512 rows)
  for (int64_t t0 = 0; t0 < k.tiles; t0 += kJobTiles)
    for (int64_t m0 = 0; m0 < M; m0 += kJobRows)
      call.jobs.push_back({m0, std::min(M, m0 + kJobRows), t0, std::min(k.tiles, t0 + kJobTiles)});
  if (call.jobs.size() == 1) {
    gemm_one(&call, 0);
    return nullptr;
  }
  return g_api->KernelContext_ParallelFor(context, gemm_one, call.jobs.size(), 0, &call);
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** kernel) {
  auto k = std::make_unique<Kernel>();
  attr_int(info, "K", 0, &k->K);
  attr_int(info, "N", 0, &k->N);
  attr_int(info, "bits", 0, &k->bits);
  attr_int(info, "block_size", 0, &k->block);
  int64_t layout = 0, activation = 0;
  attr_int(info, "layout", 0, &layout);
  attr_int(info, "activation", 0, &activation);
  k->widths[0] = k->N;
  attr_int(info, "N1", 0, &k->widths[1]);
  attr_int(info, "N2", 0, &k->widths[2]);
  k->parts = k->widths[2] > 0 ? 3 : (k->widths[1] > 0 ? 2 : 1);
  k->swiglu = activation == 1;
  if (k->K <= 0 || k->N <= 0 || (k->bits != 8 && k->bits != 4) || k->block < 8 || k->block % 8 != 0 ||
      (layout != 0 && layout != 1) || (activation != 0 && activation != 1) || k->widths[1] < 0 || k->widths[2] < 0 ||
      (k->widths[1] == 0 && k->widths[2] != 0))
    return fail("QMatMul: K and N must be positive, bits 8 or 4, block_size a positive multiple of 8, layout 0 or 1, "
                "activation 0 or 1, N1 and N2 absent or positive (N2 only with N1)");
  if ((k->parts > 1 || k->swiglu) && layout != 1)
    return fail("QMatMul: parts (N1, N2) and activation need layout 1 (MatMulNBits' tensors)");
  if (k->swiglu && (k->parts != 2 || k->widths[1] != k->N))
    return fail("QMatMul: activation 1 (swiglu) takes two parts of equal width: gate (N) and up (N1 = N)");
  k->blocks = (k->K + k->block - 1) / k->block;
  k->Kp = k->blocks * k->block;
  k->tiles = 0;
  for (int64_t p = 0; p < k->parts; ++p) k->tiles += (k->widths[p] + kTile - 1) / kTile;
  // layout 1: every part's inputs checked before anything is allocated (an N1 that does not match its weights is
  // an error, not a failed allocation), then packed part by part below
  void* data[kMaxParts][2] = {};
  if (layout == 1)
    for (int64_t p = 0; p < k->parts; ++p) RETURN_IF_ERROR(constant_inputs(info, k.get(), p, data[p]));
  if (k->parts > 1) {
    k->tile_part.resize(static_cast<size_t>(k->tiles));
    k->tile_col.resize(static_cast<size_t>(k->tiles));
    for (int64_t p = 0; p < k->parts; ++p)
      for (int64_t j = 0; j * kTile < k->widths[p]; ++j) {
        k->tile_part[static_cast<size_t>(k->tile_of(p, j))] = static_cast<int32_t>(p);
        k->tile_col[static_cast<size_t>(k->tile_of(p, j))] = j * kTile;
      }
  }
  if (layout == 1) {
    const int64_t tile_bytes = k->tile_bytes();
    k->group = g_isa.group;
    const std::string key = k->store_key();
    const size_t sizes[2] = {k->tiles_bytes(), k->scales_bytes()};
    bool mapped = false;
    RETURN_IF_ERROR(find_packed(data[0][0], key, sizes, 2, &k->packed, &mapped));
    if (!mapped) {
      // uninitialised: every byte of a real tile is packed, and a padding tile (completing the last group) is zeroed
      // below (never read; zero so that the store's copy is the same on every load)
      auto owned = std::make_shared<Owned>();
      owned->tiles = packed_buffer<uint8_t>(sizes[0]);
      owned->scales = packed_buffer<float>(sizes[1] / sizeof(float));
      k->packed = {owned, {owned->tiles.get(), owned->scales.get()}};
      for (int64_t t = k->tiles; t < k->padded_tiles(); ++t) {
        for (int64_t L = 0; L < tile_bytes / 64; ++L) std::memset(k->line(t, L), 0, 64);
        for (int64_t blk = 0; blk < k->blocks; ++blk) std::fill(k->block_scales(t, blk), k->block_scales(t, blk) + kTile, 0.f);
      }
      for (int64_t p = 0; p < k->parts; ++p) {
        pack_nbits(k.get(), p, static_cast<const uint8_t*>(data[p][0]), static_cast<const float*>(data[p][1]));
        release_mapped(data[p][0], static_cast<size_t>(k->widths[p] * k->Kp * k->bits / 8));
        release_mapped(data[p][1], static_cast<size_t>(k->widths[p] * k->blocks) * sizeof(float));
      }
      remember_packed(data[0][0], key, k->packed, sizes, 2);
    }
  }
  *kernel = k.release();
  return nullptr;
}

const char* ORT_API_CALL op_name(const OrtCustomOp*) { return "QMatMul"; }
size_t ORT_API_CALL input_count(const OrtCustomOp*) { return kResidual + 1; }
size_t ORT_API_CALL output_count(const OrtCustomOp*) { return kMaxParts; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t index) {
  return index % 3 == 1 && index != kResidual ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp*, size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
OrtCustomOpInputOutputCharacteristic ORT_API_CALL input_required(const OrtCustomOp*, size_t index) {
  return index < 3 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL output_required(const OrtCustomOp*, size_t index) {
  return index == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}

OrtCustomOp g_qmatmul = make_op({op_name, input_type, input_count, output_type, output_count, input_required,
                                         output_required, create_kernel, kernel_compute<Kernel>, kernel_destroy<Kernel>});

}  // namespace

OrtCustomOp* qmatmul_op() { return &g_qmatmul; }

const QKernels& qmatmul_kernels() {
  static const QKernels kernels{g_isa.name, g_isa.quantize, g_isa.gemm, g_isa.group};
  return kernels;
}

}  // namespace ortinf

// For `ortinf inspect` (read with ctypes): the instruction set the quantized MatMul runs with.
extern "C" __attribute__((visibility("default"))) const char* ortinf_qmatmul_isa() { return ortinf::g_isa.name; }
