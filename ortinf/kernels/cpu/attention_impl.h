// The arithmetic of ortinf's CPU paged attention, free of ONNX Runtime types so that it can be
// compiled once per instruction set (attention_avx512.cc, attention_avx2.cc, attention_generic.cc
// include it under their own -m flags) and chosen at run time (dispatch in paged_attention.cc).
//
// Why per-ISA translation units and not intrinsics: the loops below are plain C++ that GCC and
// Clang vectorise at -O3 (the dot product needs -fassociative-math, which the build passes to these
// files only); writing them once keeps AVX2, AVX-512 and the SSE2 fallback exactly the same code.
// Why not `target_clones`: it clones one function, but the helpers must be inlined into it under
// the same ISA to vectorise, and multi-feature clones (avx512f+bw+vl+f16c) cannot be spelled.
#pragma once

#include <cstdint>

namespace ortinf {

// How the pool holds a row (one token's K or V of one head):
//   kFloat: head_dim floats; kHalf: head_dim IEEE halves;
//   kInt8:  head_dim int8 values then the row's float scale (4 bytes, native order): value = q * scale,
//           scale = max|x| / 127, q = round(x / scale) in -127..127 (per token, per head, like
//           llama.cpp's q8_0 with its scale inside the block). One tensor per K or V, so the graph's
//           one ScatterND per pool writes rows and scales together, and the op reads both in place.
enum CacheKind : int { kFloat = 0, kHalf = 1, kInt8 = 2 };

inline int64_t row_bytes(CacheKind kind, int64_t head_dim) {
  return kind == kInt8 ? head_dim + 4 : head_dim * (kind == kHalf ? 2 : 4);
}

// One unit of parallel work: the queries [q_begin, q_end) of sequence `seq` against KV head
// `kv_head`. All query heads of that KV head's group are computed together, so every key and value
// row read from the pool serves `group` query rows (GQA without repeating K/V).
struct Job {
  int64_t seq;
  int64_t kv_head;
  int64_t q_begin;
  int64_t q_end;
};

// Everything a job reads, for one layer and one step. Pointers are ONNX Runtime's own buffers: the
// pool is read in place through the block table, never copied.
//
//   flat tokens   t:  0 1 2 3 4 | 5 | 6 7          query_lens   = [5, 1, 2]
//   starts        s:  0         | 5 | 6            context_lens = [0, 9, 3]  (already in the pool)
//
// Query i of sequence s sits at absolute position context_lens[s] + i. Its keys are the pool's
// slots 0 .. context_lens[s] - 1 (slot j in block block_tables[s, j / block_size], offset
// j % block_size) followed by the step's own new keys 0 .. i (rows starts[s] .. starts[s] + i of
// `key`), so a sequence stops at its own length: nothing is padded to the longest context.
struct Step {
  const float* query;      // [T, num_heads * head_dim] (before RoPE when cos is set)
  const float* key;        // [T, kv_heads * head_dim]: this step's new keys, after RoPE
  const float* cos;        // [T, rotary_dim] or null: RoPE is applied to each query row as it is loaded
  const float* sin;
  int64_t rotary_dim;
  const float* value;      // [T, kv_heads * head_dim]
  const int8_t* key_rows;  // an int8 pool: the step's K and V as the pool's rows, [T, kv_heads, head_dim + 4]; the
  const int8_t* value_rows;  // jobs read the step's own keys from these (not key/value), as they read the pool
  const void* key_cache;   // [kv_heads, pool_blocks, block_size, row], rows of float, IEEE half or int8 (below)
  const void* value_cache;
  CacheKind cache_kind;
  const int64_t* block_tables;  // [num_seqs, max_blocks]
  const int64_t* context_lens;  // [num_seqs]
  const int64_t* starts;        // [num_seqs]: first flat token of each sequence
  int64_t max_blocks;
  int64_t pool_blocks;
  int64_t block_size;
  int64_t num_heads;
  int64_t kv_heads;
  int64_t head_dim;
  float scale;
  int64_t sliding_window;  // 0: none; else a query at p sees keys k with p - k < sliding_window
  float softcap;           // 0: none; else scores become softcap * tanh(scores / softcap)
  float* out;              // [T, num_heads * head_dim]
  const float* sinks;      // [num_heads] or null: gpt-oss's attention sinks, one more logit per head whose
                           // probability weighs nothing (the softmax starts at max = sink, sum = 1)
  const int64_t* until;    // [T] or null: the last position each token sees when past its own (Gemma 3's image
                           // tokens see their whole image at prefill; within this step's tokens)
  bool cross;              // cross-attention (Whisper): every query sees exactly the cached keys 0 ..
                           // context_lens[s] - 1 (an encoder's K/V in blocks of their own), no causal cut,
                           // and not the step's own keys
};

// The largest query tile per job and the head_dim limit of the per-thread scratch buffers.
constexpr int64_t kQueryTile = 16;
constexpr int64_t kMaxHeadDim = 512;

// RoPE as transformers' apply_rotary_pos_emb computes it (rotate_half on the first `rotary_dim`
// elements, the rest passed through): out = x * cos + rotate_half(x) * sin, where rotate_half(x) is
// (-x[h:], x[:h]) with h = rotary_dim / 2. `scale` multiplies the result (the query's softmax scale).
inline void rope(const float* x, const float* cos, const float* sin, int64_t rotary_dim, int64_t dim, float scale,
                 float* out) {
  const int64_t h = rotary_dim / 2;
  for (int64_t d = 0; d < h; ++d) out[d] = (x[d] * cos[d] - x[d + h] * sin[d]) * scale;
  for (int64_t d = h; d < rotary_dim; ++d) out[d] = (x[d] * cos[d] + x[d - h] * sin[d]) * scale;
  for (int64_t d = rotary_dim; d < dim; ++d) out[d] = x[d] * scale;
}

// Rounds n floats through IEEE half (to nearest even), as a half pool stores them: with a half pool,
// the step's own keys and values are read rounded too, so a token sees the same numbers whether
// its context came from the pool (an earlier chunk or step) or from this step (chunked prefill is
// then exact: the same logits as an unchunked one).
void round_half_avx512(const float* src, float* dst, int64_t n);
void round_half_avx2(const float* src, float* dst, int64_t n);
void round_half_generic(const float* src, float* dst, int64_t n);

void run_job_avx512(const Step& step, const Job& job);
void run_job_avx2(const Step& step, const Job& job);
void run_job_generic(const Step& step, const Job& job);

}  // namespace ortinf
