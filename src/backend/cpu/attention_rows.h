// The two inner loops of CPU attention for one query row, per kernel family: raw scores against
// every key row, and the probability-weighted sum of the value rows. attention.cc owns
// everything around them (row tables, bias, softmax, the split of work); each family supplies
// these loops for f32 and bf16 (a bf16 KV cache) rows.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace kiln::cpu {

// Rows of the KV cache are a page apart (the hardware prefetcher stops at each), and in decode
// they come from memory (the weights streamed since evicted them): the slices a loop reads are
// requested this many rows ahead.
constexpr int64_t kRowsAhead = 8;

// Asks for the cache lines of p[0, elements) (a row's slice of the heads an item reads).
template <class E>
inline void prefetch_slice(const E* p, int64_t elements) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < elements * static_cast<int64_t>(sizeof(E)); b += 64)
    _mm_prefetch(c + b, _MM_HINT_T0);
}

template <class E>  // float, or uint16_t for a bf16 KV cache
struct AttentionRowLoops {
  // scores[(h - h0) * ld + j] = q[h * dh, (h + 1) * dh) . keys[j][h * dh, ...) for the heads
  // [h0, h0 + nh) and j < n. Each score's sum has a fixed order that depends only on dh.
  // `then`: the value rows the weighted sum reads next (a loop may request its first ones).
  void (*scores)(const float* q, const E* const* keys, const E* const* then, int64_t h0, int64_t nh,
                 int64_t dh, int64_t n, float* scores, int64_t ld);
  // acc[(h - h0) * dh + d] = sum_j p[(h - h0) * ldp + j] * values[j][h * dh + d] for j < n,
  // j in index order.
  void (*weighted_sum)(const float* p, int64_t ldp, const E* const* values, int64_t h0, int64_t nh,
                       int64_t dh, int64_t n, float* acc);
};

// AVX-512 (attention_avx512.cc): 16-lane FMA chains, four value rows per pass over the
// accumulators.
AttentionRowLoops<float> avx512_row_loops_f32();
AttentionRowLoops<uint16_t> avx512_row_loops_bf16();

// One head of encoder self-attention over a whole sequence: every query row against every key
// (no mask), attention_prompt.cc. Rows of q, k, v and y are `*_stride` floats apart, the head's
// elements at head · dh. Bias: T5's (t5_bias[key - query], the head's run of relative
// positions centred on 0) and/or ALiBi's (slope · key); scale multiplies the raw scores first.
struct PromptHead {
  const float* q;
  const float* k;
  const float* v;
  float* y;
  int64_t q_stride, kv_stride, y_stride;
  int64_t tokens, head, dh;  // dh: a multiple of 16
  float scale = 1.0f;
  const float* t5_bias = nullptr;
  float slope = 0.0f;
};
// Floats of scratch prompt_head_avx512 needs (the transposed keys and a block of scores).
int64_t prompt_head_scratch_floats(int64_t tokens, int64_t dh);
void prompt_head_avx512(const PromptHead& p, float* scratch);

}  // namespace kiln::cpu
