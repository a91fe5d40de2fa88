// The instruction peaks benchmarks/peak.py reports: each thread runs 12 independent chains of one instruction on
// registers (no memory), so the rate is the core's issue limit for that instruction, times the threads. Built with
// the system gcc at run time (peak.py); each kernel carries its own target attribute, and peak_supported() says
// whether this CPU runs it.
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

enum { FMA256 = 0, FMA512 = 1, DPBF16 = 2, DPBUSD = 3, KINDS = 4 };

int peak_supported(int kind) {
  __builtin_cpu_init();
  switch (kind) {
    case FMA256: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case FMA512: return __builtin_cpu_supports("avx512f");
    case DPBF16: return __builtin_cpu_supports("avx512bf16");
    case DPBUSD: return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
  }
  return 0;
}

// Operations per instruction: FMA 2 per fp32 lane; vdpbf16ps 2 products + 2 adds per fp32 lane; vpdpbusd 4 products +
// 4 adds per int32 lane.
double peak_ops_per_instruction(int kind) {
  static const double ops[KINDS] = {16, 32, 64, 128};
  return ops[kind];
}

// One runner per instruction: 12 accumulators of type VEC, each set by INIT(i), stepped by STEP(acc) n times (x and
// y are the operands; the empty asm keeps the compiler from hoisting the loop), then one lane of each summed by LANE.
#define RUNNER(NAME, TARGET, VEC, XTYPE, X, INIT, STEP, LANE)    \
  __attribute__((target(TARGET))) static float NAME(long n) {    \
    VEC a[12];                                                   \
    XTYPE x = X, y = X;                                          \
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) a[i] = INIT(i); \
    for (long r = 0; r < n; ++r) {                               \
      _Pragma("GCC unroll 12") for (int i = 0; i < 12; ++i) a[i] = STEP(a[i], x, y); \
      __asm__ volatile("" : "+v"(x));                            \
    }                                                            \
    float s = 0;                                                 \
    for (int i = 0; i < 12; ++i) s += (float)LANE(a[i]);         \
    return s;                                                    \
  }

#define SET256(i) _mm256_set1_ps((float)(i))
#define SET512(i) _mm512_set1_ps((float)(i))
#define SETI512(i) _mm512_set1_epi32(i)
#define LANE256(v) _mm256_cvtss_f32(v)
#define LANE512(v) _mm512_cvtss_f32(v)
RUNNER(run_fma256, "avx2,fma", __m256, __m256, _mm256_set1_ps(1.0000001f), SET256, _mm256_fmadd_ps, LANE256)
RUNNER(run_fma512, "avx512f", __m512, __m512, _mm512_set1_ps(1.0000001f), SET512, _mm512_fmadd_ps, LANE512)
RUNNER(run_dpbf16, "avx512f,avx512bf16", __m512, __m512bh, (__m512bh)_mm512_set1_epi16(0x3f80), SET512, _mm512_dpbf16_ps, LANE512)
RUNNER(run_dpbusd, "avx512f,avx512bw,avx512vnni", __m512i, __m512i, _mm512_set1_epi8(1), SETI512, _mm512_dpbusd_epi32,
       _mm512_cvtsi512_si32)

typedef struct {
  int kind;
  long n;
  volatile float sink;
} Work;

static void* work(void* p) {
  Work* w = (Work*)p;
  switch (w->kind) {
    case FMA256: w->sink = run_fma256(w->n); break;
    case FMA512: w->sink = run_fma512(w->n); break;
    case DPBF16: w->sink = run_dpbf16(w->n); break;
    case DPBUSD: w->sink = run_dpbusd(w->n); break;
  }
  return 0;
}

// Operations per second of `kind` on `threads` threads, each running `n` rounds of the 12 chains.
double peak_rate(int kind, int threads, long n) {
  pthread_t ids[64];
  Work works[64];
  if (threads < 1 || threads > 64 || !peak_supported(kind)) return 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int t = 0; t < threads; ++t) {
    works[t].kind = kind;
    works[t].n = n;
    pthread_create(&ids[t], 0, work, &works[t]);
  }
  for (int t = 0; t < threads; ++t) pthread_join(ids[t], 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double seconds = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  return threads * (double)n * 12 * peak_ops_per_instruction(kind) / seconds;
}
