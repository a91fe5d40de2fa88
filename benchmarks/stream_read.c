/* The read loops of benchmarks/bandwidth.py: threads that each sum a disjoint part of one buffer, timed between two
 * barriers (so the figure is the slowest thread's, both cores reading at once). Built by bandwidth.py with the system gcc
 * into the temp folder and loaded with ctypes; a benchmark helper, not part of ortinf's kernel library.
 *
 * kinds: 0 plain C over uint64 (what gcc makes of it at -O2), 1 AVX2 32-byte loads, 2 AVX-512 64-byte loads,
 * 3 AVX-512 non-temporal loads (vmovntdqa), 4 AVX-512 loads with prefetchnta 1 KiB ahead, 5 AVX-512 loads over four
 * streams per thread, 6 AVX-512 loads with prefetcht0 2 KiB ahead. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint64_t sum_plain(const char *p, size_t bytes) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < bytes / 8; i += 4) {
        a += q[i];
        b += q[i + 1];
        c += q[i + 2];
        d += q[i + 3];
    }
    return a + b + c + d;
}

__attribute__((target("avx2"))) static uint64_t sum_avx2(const char *p, size_t bytes) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < bytes; i += 128) {
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    __m256i s = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    return (uint64_t)_mm256_extract_epi64(s, 0) + (uint64_t)_mm256_extract_epi64(s, 3);
}

#define SUM512(LOAD, PREFETCH)                                                      \
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;                        \
    for (size_t i = 0; i < bytes; i += 256) {                                       \
        PREFETCH;                                                                   \
        a = _mm512_add_epi64(a, LOAD((void *)(p + i)));                             \
        b = _mm512_add_epi64(b, LOAD((void *)(p + i + 64)));                        \
        c = _mm512_add_epi64(c, LOAD((void *)(p + i + 128)));                       \
        d = _mm512_add_epi64(d, LOAD((void *)(p + i + 192)));                       \
    }                                                                               \
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));

__attribute__((target("avx512f"))) static uint64_t sum_avx512(const char *p, size_t bytes) {
    SUM512(_mm512_load_si512, (void)0)
}

__attribute__((target("avx512f"))) static uint64_t sum_avx512_nt(const char *p, size_t bytes) {
    SUM512(_mm512_stream_load_si512, (void)0)
}

__attribute__((target("avx512f"))) static uint64_t sum_avx512_prefetch(const char *p, size_t bytes) {
    SUM512(_mm512_load_si512, (_mm_prefetch(p + i + 1024, _MM_HINT_NTA), _mm_prefetch(p + i + 1088, _MM_HINT_NTA),
                               _mm_prefetch(p + i + 1152, _MM_HINT_NTA), _mm_prefetch(p + i + 1216, _MM_HINT_NTA)))
}

/* Four streams at once: the part split in four quarters read side by side (more misses in flight than one stream's
 * prefetcher keeps, as a GEMV over several column panels reads). */
__attribute__((target("avx512f"))) static uint64_t sum_avx512_streams(const char *p, size_t bytes) {
    size_t q = bytes / 4 / 128 * 128;
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i < q; i += 128) {
        a = _mm512_add_epi64(a, _mm512_add_epi64(_mm512_load_si512(p + i), _mm512_load_si512(p + i + 64)));
        b = _mm512_add_epi64(b, _mm512_add_epi64(_mm512_load_si512(p + q + i), _mm512_load_si512(p + q + i + 64)));
        c = _mm512_add_epi64(c, _mm512_add_epi64(_mm512_load_si512(p + 2 * q + i), _mm512_load_si512(p + 2 * q + i + 64)));
        d = _mm512_add_epi64(d, _mm512_add_epi64(_mm512_load_si512(p + 3 * q + i), _mm512_load_si512(p + 3 * q + i + 64)));
    }
    return (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
}

/* 64-byte loads with prefetcht0 2 KiB ahead (into every cache level, as a kernel's software prefetch would). */
__attribute__((target("avx512f"))) static uint64_t sum_avx512_t0(const char *p, size_t bytes) {
    SUM512(_mm512_load_si512, (_mm_prefetch(p + i + 2048, _MM_HINT_T0), _mm_prefetch(p + i + 2112, _MM_HINT_T0),
                               _mm_prefetch(p + i + 2176, _MM_HINT_T0), _mm_prefetch(p + i + 2240, _MM_HINT_T0)))
}

int stream_supported(int kind) {
    __builtin_cpu_init();
    if (kind == 0) return 1;
    if (kind == 1) return __builtin_cpu_supports("avx2");
    if (kind >= 2 && kind <= 6) return __builtin_cpu_supports("avx512f");
    return 0;
}

typedef struct {
    const char *p;
    size_t bytes;
    int kind, repeats, index;
    pthread_barrier_t *barrier;
    double *seconds;  /* per repeat, written by thread 0 */
    volatile uint64_t sink;
} job;

static void *reader(void *arg) {
    job *j = (job *)arg;
    uint64_t s = 0;
    for (int r = 0; r < j->repeats; r++) {
        pthread_barrier_wait(j->barrier);
        double start = now();
        switch (j->kind) {
            case 0: s += sum_plain(j->p, j->bytes); break;
            case 1: s += sum_avx2(j->p, j->bytes); break;
            case 2: s += sum_avx512(j->p, j->bytes); break;
            case 3: s += sum_avx512_nt(j->p, j->bytes); break;
            case 4: s += sum_avx512_prefetch(j->p, j->bytes); break;
            case 5: s += sum_avx512_streams(j->p, j->bytes); break;
            default: s += sum_avx512_t0(j->p, j->bytes); break;
        }
        pthread_barrier_wait(j->barrier);
        if (j->index == 0) j->seconds[r] = now() - start;
    }
    j->sink = s;
    return NULL;
}

/* A buffer of `bytes` (a multiple of 2 MiB), 2 MiB aligned, transparent huge pages asked for, every page written. */
void *stream_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, bytes)) return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, 1, bytes);
    return p;
}

void stream_free(void *p) { free(p); }

/* Reads `bytes` of `p` (split evenly over `threads`, each part a multiple of 256 bytes) `repeats` times; writes each
 * round's seconds (barrier to barrier) into `seconds`. Returns 0, or -1 for a thread count out of range. */
int stream_read(const char *p, size_t bytes, int threads, int kind, int repeats, double *seconds) {
    if (threads < 1 || threads > 64) return -1;
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    job jobs[64];
    pthread_t ids[64];
    size_t part = bytes / (size_t)threads / 256 * 256;
    for (int t = 0; t < threads; t++)
        jobs[t] = (job){p + (size_t)t * part, part, kind, repeats, t, &barrier, seconds, 0};
    for (int t = 1; t < threads; t++)
        if (pthread_create(&ids[t], NULL, reader, &jobs[t])) abort();  /* the started ones would wait at the barrier forever */
    reader(&jobs[0]);
    for (int t = 1; t < threads; t++) pthread_join(ids[t], NULL);
    pthread_barrier_destroy(&barrier);
    return 0;
}
