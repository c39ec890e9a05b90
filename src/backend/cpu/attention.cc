// Attention over ragged sequences: encoder self attention (keys = the sequence's own tokens),
// cached self attention (append this step's K/V to the paged cache, attend to all of it) and
// cross attention (keys = the request's cross K/V). Scores, position bias and softmax in fp32.
//
// Where each key and value row lives is resolved once per sequence into a table of row pointers
// (block-table lookups for the paged cache), so the inner loops over keys are plain pointer
// reads: resolving a block per key per query made long prompts far slower than quadratic
// (a 1,850-token BLOOM prompt took 7 s on the 16 MB fixture). Summation orders are unchanged:
// a sequence's result does not depend on its batch.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/attention_rows.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/vector_math.h"
#include "graph/position_bias.h"

namespace kiln::cpu {
namespace {

// dst[i] = src[i] rounded to bf16 (to nearest even, as float_to_bf16), eight at a time.
void round_row_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const U32x8 x = reinterpret_cast<U32x8>(load8(src + i));
    const U32x8 rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const U32x8 quiet_nan = (x >> 16) | 0x40u;
    const U32x8 bits = (x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
    *reinterpret_cast<U16x8*>(dst + i) = __builtin_convertvector(bits, U16x8);
  }
  for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

// This step's K/V rows of sequences [s0, s1) copied into their cache blocks for `layer`
// (rounded to bf16 when the cache holds bf16). Decode writes each row to a page of the cache
// that no step has written yet, and on this VM that cost far more than the bytes (bloom-560m
// bf16, batch 16: ~180 us a layer on one thread against ~15 us in kiln_attention_bench, whose
// pages were all written before; neither non-temporal stores nor prefetching the lines for
// writing changed it), so the sequences are split across the threads (~105 us; no two
// sequences write to one block in a step).
void append_to_cache(const StepLayout& L, int s0, int s1, KvStorage* cache, int layer,
                     const float* k, const float* v, int64_t k_stride, int64_t width) {
  const int bs = cache->geometry().block_size;
  const bool bf16 = cache->geometry().dtype == DType::kBF16;
  for (int s = s0; s < s1; ++s) {
    const std::span<const int32_t> blocks = L.blocks(s);
    for (int64_t i = 0; i < L.num_tokens(s); ++i) {
      const int64_t pos = L.past_len[s] + i;
      const int32_t b = blocks[pos / bs];
      const int64_t off = (pos % bs) * width;
      const int64_t row = L.token_begin[s] + i;
      if (bf16) {
        round_row_to_bf16(k + row * k_stride,
                          static_cast<uint16_t*>(cache->key_block(layer, b)) + off, width);
        round_row_to_bf16(v + row * k_stride,
                          static_cast<uint16_t*>(cache->value_block(layer, b)) + off, width);
        continue;
      }
      std::memcpy(static_cast<float*>(cache->key_block(layer, b)) + off, k + row * k_stride,
                  width * sizeof(float));
      std::memcpy(static_cast<float*>(cache->value_block(layer, b)) + off, v + row * k_stride,
                  width * sizeof(float));
    }
  }
}

// Row pointers (to the start of each position's [H*dh] row) of one sequence's keys and values:
// E = float, or uint16_t for a bf16 KV cache.
template <class E>
struct KeyRows {
  std::vector<const E*> keys, values;
};

template <class E>
void dense_rows(KeyRows<E>& r, const E* k, const E* v, int64_t stride, int64_t len) {
  r.keys.resize(static_cast<size_t>(len));
  r.values.resize(static_cast<size_t>(len));
  for (int64_t j = 0; j < len; ++j) {
    r.keys[j] = k + j * stride;
    r.values[j] = v + j * stride;
  }
}

template <class E>
void paged_rows(KeyRows<E>& r, KvStorage* cache, int layer, std::span<const int32_t> blocks,
                int64_t len, int64_t width) {
  const int bs = cache->geometry().block_size;
  r.keys.resize(static_cast<size_t>(len));
  r.values.resize(static_cast<size_t>(len));
  for (int64_t b = 0; b * bs < len; ++b) {
    const E* kb = static_cast<const E*>(cache->key_block(layer, blocks[b]));
    const E* vb = static_cast<const E*>(cache->value_block(layer, blocks[b]));
    for (int64_t i = 0; i < bs && b * bs + i < len; ++i) {
      r.keys[b * bs + i] = kb + i * width;
      r.values[b * bs + i] = vb + i * width;
    }
  }
}

// p[j] = p[j] * scale + slope * (first + j) for j < n (ALiBi over keys from position `first`;
// slope 0: no bias), eight at a time; returns the largest.
float scale_and_bias(float* p, int64_t n, float scale, float slope, int64_t first) {
  const V8 s = {scale, scale, scale, scale, scale, scale, scale, scale};
  const V8 m = {slope, slope, slope, slope, slope, slope, slope, slope};
  const float f = static_cast<float>(first);
  V8 pos = {f, f + 1, f + 2, f + 3, f + 4, f + 5, f + 6, f + 7};
  const V8 step = {8, 8, 8, 8, 8, 8, 8, 8};
  V8 mx = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8, pos += step) {
    const V8 v = load8(p + j) * s + m * pos;
    std::memcpy(p + j, &v, sizeof(v));
    mx = mx > v ? mx : v;
  }
  float best = -INFINITY;
  for (int l = 0; l < 8; ++l) best = std::max(best, mx[l]);
  for (; j < n; ++j) {
    p[j] = p[j] * scale + slope * static_cast<float>(first + j);
    best = std::max(best, p[j]);
  }
  return best;
}

// p[j] = p[j] * scale + bias[j] for j < n (T5's bias of each key), eight at a time; returns the
// largest.
float scale_and_add(float* p, int64_t n, float scale, const float* bias) {
  const V8 s = {scale, scale, scale, scale, scale, scale, scale, scale};
  V8 mx = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const V8 v = load8(p + j) * s + load8(bias + j);
    std::memcpy(p + j, &v, sizeof(v));
    mx = mx > v ? mx : v;
  }
  float best = -INFINITY;
  for (int l = 0; l < 8; ++l) best = std::max(best, mx[l]);
  for (; j < n; ++j) {
    p[j] = p[j] * scale + bias[j];
    best = std::max(best, p[j]);
  }
  return best;
}

// p[j] = e^(p[j] - mx) for j < n; returns their sum (eight lane sums added in a fixed order,
// then the tail).
float exp_shifted(float* p, int64_t n, float mx) {
  const __m256 m = _mm256_set1_ps(mx);
  __m256 sum = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), m));
    _mm256_storeu_ps(p + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = hsum(*reinterpret_cast<const V8*>(lanes));
  for (; j < n; ++j) total += (p[j] = std::exp(p[j] - mx));
  return total;
}

// acc[(h - h0) * dh + d] = sum_j p[(h - h0) * ldp + j] * values[j][h * dh + d] for the heads
// [h0, h0 + nh), j in index order, value row by value row (each read once, contiguously).
template <class E>
void weighted_sum(const float* p, int64_t ldp, const E* const* values, int64_t h0, int64_t nh,
                  int64_t dh, int64_t n, float* acc) {
  std::fill(acc, acc + nh * dh, 0.0f);
  const int64_t vec_end = dh / 8 * 8;
  for (int64_t j = 0; j < n; ++j) {
    if (j + kRowsAhead < n) prefetch_slice(values[j + kRowsAhead] + h0 * dh, nh * dh);
    const E* vr = values[j] + h0 * dh;
    for (int64_t h = 0; h < nh; ++h) {
      const float w = p[h * ldp + j];
      const V8 wv = {w, w, w, w, w, w, w, w};
      float* ah = acc + h * dh;
      const E* vh = vr + h * dh;
      int64_t d = 0;
      for (; d < vec_end; d += 8) {
        V8 r = load8(ah + d);
        r += wv * load8(vh + d);
        std::memcpy(ah + d, &r, sizeof(r));
      }
      for (; d < dh; ++d) ah[d] += w * to_f32(vh[d]);
    }
  }
}

// One query row's attention over a range of keys for nh heads, not yet normalized: per head
// the largest score, the sum of e^(score - largest) and the value rows weighted by those
// exponentials. Empty range: largest -inf, sum 0, acc 0.
struct Partial {
  float* largest;  // [nh]
  float* sum;      // [nh]
  float* acc;      // [nh * dh]
};

// y[h] = (a0 acc0[h] + a1 acc1[h]) / (a0 sum0[h] + a1 sum1[h]) with a_i = e^(largest_i[h] - m),
// m the larger of the two (a_i = 0 for an empty part): the softmax-weighted sum over both parts.
void combine(const Partial& p0, const Partial& p1, int64_t nh, int64_t dh, float* y) {
  for (int64_t h = 0; h < nh; ++h) {
    const float m = std::max(p0.largest[h], p1.largest[h]);
    const float a0 = p0.sum[h] > 0.0f ? std::exp(p0.largest[h] - m) : 0.0f;
    const float a1 = p1.sum[h] > 0.0f ? std::exp(p1.largest[h] - m) : 0.0f;
    // No keys at all (an empty cross K/V): zeros, not 0 / 0.
    const float total = a0 * p0.sum[h] + a1 * p1.sum[h];
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    const float w0 = a0 * inv, w1 = a1 * inv;
    const float* x0 = p0.acc + h * dh;
    const float* x1 = p1.acc + h * dh;
    float* yh = y + h * dh;
    for (int64_t d = 0; d < dh; ++d) yh[d] = w0 * x0[d] + w1 * x1[d];
  }
}

template <class E>
void scores_avx2(const float* q, const E* const* keys, const E* const* /*then*/, int64_t h0,
                 int64_t nh, int64_t dh, int64_t n, float* scores, int64_t ld) {
  for (int64_t j = 0; j < n; ++j) {
    if (j + kRowsAhead < n) prefetch_slice(keys[j + kRowsAhead] + h0 * dh, nh * dh);
    const E* kr = keys[j];
    for (int64_t h = h0; h < h0 + nh; ++h)
      scores[(h - h0) * ld + j] = dot(q + h * dh, kr + h * dh, dh);
  }
}

template <class E>
AttentionRowLoops<E> avx2_row_loops() {
  return {scores_avx2<E>, weighted_sum<E>};
}

// Which inner loops run (attention_rows.h): f32 rows and bf16 cache rows.
struct RowLoops {
  AttentionRowLoops<float> f32;
  AttentionRowLoops<uint16_t> bf16;
  bool prompt_tiles = false;  // encoder self-attention in prompt_head_avx512's register tiles
};

void attention_with(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                    const KernelEnv& env, const RowLoops& loops);

}  // namespace

void attention(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
               const KernelEnv& env) {
  attention_with(node, in, out, env, {avx2_row_loops<float>(), avx2_row_loops<uint16_t>()});
}

void attention_avx512(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                      const KernelEnv& env) {
  attention_with(node, in, out, env, {avx512_row_loops_f32(), avx512_row_loops_bf16(), true});
}

namespace {

// q [n, H*dh] (or packed qkv [n, 3*H*dh] as [3, H, dh]), k, v [n, H*dh], rel table [buckets, H]
// -> [n, H*dh]
void attention_with(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                    const KernelEnv& env, const RowLoops& loops) {
  const AttentionAttrs& a = node.attr<AttentionAttrs>();
  KILN_CHECK(env.step != nullptr && env.step->layout != nullptr,
             "node '{}': attention needs the step's layout", node.name);
  const StepLayout& L = *env.step->layout;
  KvStorage* cache = env.step->kv;
  const int64_t H = a.num_heads, dh = a.head_dim, width = H * dh;
  const int64_t n = in[0].dim(0);
  KILN_CHECK(L.total_tokens() == n, "node '{}': step layout covers {} tokens, input has {}",
             node.name, L.total_tokens(), n);

  const float* q = in[0].data<float>();
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t q_stride = width, kv_stride = width;
  size_t next = 1;
  if (a.packed_qkv) {
    k = q + width;
    v = q + 2 * width;
    q_stride = kv_stride = 3 * width;
  } else if (a.kind != AttentionKind::kCross) {
    k = in[1].data<float>();
    v = in[2].data<float>();
    next = 3;
  }
  const float* rel_table = a.bias == PositionBias::kT5Relative ? in[next].data<float>() : nullptr;
  const std::vector<float> slopes =
      a.bias == PositionBias::kAlibi ? alibi_slopes(a.num_heads) : std::vector<float>{};
  float* y = out[0].data<float>();

  const int nseq = L.num_seqs();
  if (a.kind == AttentionKind::kCachedSelf) {
    KILN_CHECK(cache != nullptr, "node '{}': cached attention without a KV cache", node.name);
    const KvGeometry& geo = cache->geometry();
    KILN_CHECK(geo.row_width == width && (geo.dtype == DType::kF32 || geo.dtype == DType::kBF16) &&
                   a.layer < geo.layers,
               "node '{}': KV cache holds {} layers of {} rows {} wide, need layer {} of f32 or "
               "bf16 rows {} wide",
               node.name, geo.layers, dtype_name(geo.dtype), geo.row_width, a.layer, width);
    // Sequences split across the threads (a row written this step is in no other sequence's
    // blocks), so that twice as many lines are requested at once.
    env.pool.parallel_for(nseq, 1, [&](int64_t s0, int64_t s1) {
      append_to_cache(L, static_cast<int>(s0), static_cast<int>(s1), cache, a.layer, k, v,
                      kv_stride, width);
    });
  }

  // Key/value row tables, one per sequence, resolved before the parallel loop: f32 rows, or
  // bf16 ones from a bf16 cache or bf16 cross K/V (CPU bf16 and int8-weight plans).
  bool bf16_kv = a.kind == AttentionKind::kCachedSelf && cache->geometry().dtype == DType::kBF16;
  if (a.kind == AttentionKind::kCross) {
    DType first = DType::kF32;
    for (int s = 0; s < nseq; ++s) {
      const CrossKv* cross = L.cross[s];
      KILN_CHECK(cross != nullptr && a.layer < static_cast<int>(cross->keys.size()),
                 "node '{}': sequence has no cross K/V for layer {}", node.name, a.layer);
      const DType t = cross->keys[a.layer].dtype();
      if (s == 0) first = t;
      KILN_CHECK((t == DType::kF32 || t == DType::kBF16) && cross->values[a.layer].dtype() == t &&
                     t == first,
                 "node '{}': cross K/V of sequence {} are {}/{}; every sequence's must be f32 or "
                 "every sequence's bf16",
                 node.name, s, dtype_name(t), dtype_name(cross->values[a.layer].dtype()));
    }
    bf16_kv = first == DType::kBF16;
  }
  std::vector<KeyRows<float>> rows(static_cast<size_t>(nseq));
  std::vector<KeyRows<uint16_t>> bf16_rows(bf16_kv ? static_cast<size_t>(nseq) : 0);
  for (int s = 0; s < nseq; ++s) {
    const int64_t begin = L.token_begin[s], tokens = L.num_tokens(s);
    switch (a.kind) {
      case AttentionKind::kEncoderSelf:
        dense_rows(rows[s], k + begin * kv_stride, v + begin * kv_stride, kv_stride, tokens);
        break;
      case AttentionKind::kCachedSelf:
        if (bf16_kv)
          paged_rows(bf16_rows[s], cache, a.layer, L.blocks(s), L.past_len[s] + tokens, width);
        else
          paged_rows(rows[s], cache, a.layer, L.blocks(s), L.past_len[s] + tokens, width);
        break;
      case AttentionKind::kCross: {
        const CrossKv* cross = L.cross[s];
        if (bf16_kv)
          dense_rows(bf16_rows[s], static_cast<const uint16_t*>(cross->keys[a.layer].raw()),
                     static_cast<const uint16_t*>(cross->values[a.layer].raw()), width,
                     cross->length());
        else
          dense_rows(rows[s], cross->keys[a.layer].data<float>(),
                     cross->values[a.layer].data<float>(), width, cross->length());
        break;
      }
    }
  }

  // T5's bias of every head at every relative position d = key - query a step can meet, at
  // bias_at[h * span + d + farthest_query]: a key's bucket takes a logarithm (a prompt's rows
  // would take one per key and query), and a row of keys then reads its biases as one
  // contiguous run.
  int64_t farthest_query = 0, span = 0;
  std::vector<float> bias_at;
  if (a.bias == PositionBias::kT5Relative) {
    int64_t farthest_key = 0;
    for (int s = 0; s < nseq; ++s) {
      const int64_t past = a.kind == AttentionKind::kCachedSelf ? L.past_len[s] : 0;
      const int64_t keys =
          static_cast<int64_t>(bf16_kv ? bf16_rows[s].keys.size() : rows[s].keys.size());
      farthest_query = std::max(farthest_query, past + L.num_tokens(s));
      farthest_key = std::max(farthest_key, keys);
    }
    span = farthest_query + farthest_key + 1;
    bias_at.resize(static_cast<size_t>(H * span));
    for (int64_t d = -farthest_query; d <= farthest_key; ++d) {
      const int64_t bucket =
          t5_relative_bucket(d, a.bidirectional_buckets, a.num_buckets, a.max_distance);
      for (int64_t h = 0; h < H; ++h)
        bias_at[h * span + d + farthest_query] = rel_table[bucket * H + h];
    }
  }

  // Encoder self-attention on AVX-512 (T5's: every query row sees every key): each (sequence,
  // head) of the whole prompt in register tiles (attention_prompt.cc), the pairs taken from a
  // shared counter.
  if (a.kind == AttentionKind::kEncoderSelf && !a.causal && loops.prompt_tiles && dh % 16 == 0) {
    const int64_t pairs = nseq * H;
    std::atomic<int64_t> next_pair{0};
    env.pool.parallel_for(std::min<int64_t>(env.pool.size(), pairs), 1, [&](int64_t, int64_t) {
      static thread_local std::vector<float> scratch;
      for (;;) {
        const int64_t pair = next_pair.fetch_add(1, std::memory_order_relaxed);
        if (pair >= pairs) break;
        const int s = static_cast<int>(pair / H);
        const int64_t h = pair % H, begin = L.token_begin[s];
        PromptHead p{q + begin * q_stride,
                     k + begin * kv_stride,
                     v + begin * kv_stride,
                     y + begin * width,
                     q_stride,
                     kv_stride,
                     width,
                     L.num_tokens(s),
                     h,
                     dh};
        p.scale = a.scale;
        if (a.bias == PositionBias::kT5Relative)
          p.t5_bias = bias_at.data() + h * span + farthest_query;
        if (a.bias == PositionBias::kAlibi) p.slope = slopes[h];
        scratch.resize(static_cast<size_t>(prompt_head_scratch_floats(p.tokens, dh)));
        prompt_head_avx512(p, scratch.data());
      }
    });
    return;
  }

  // Every query row attends to its visible keys in two halves, [0, m) and [m, visible) with m =
  // ceil(visible / 2): each half's scores, softmax numerators and weighted values, then the two
  // joined (combine). A row's sums thus depend only on its own keys, whoever computes the halves:
  // at batch 1 a decode row (one query row in its sequence) is split into two work items, one
  // half each, all heads, so that both threads stream whole contiguous K/V rows (a split of the
  // heads read a slice of every row, ~13-20 GB/s of cache: flan-t5-base int8 cross attention
  // 26 -> 16 us a layer, bloom-560m 63-72 -> 51 us) and the halves are joined after the loop;
  // other rows are computed half after half inside one item.
  //
  // Other work items: (sequence, group of heads, block of queries), so one long prompt still
  // spreads over every thread. A group's heads are adjacent columns, so an item reads one
  // contiguous slice of each key and value row. Heads are split into groups only as far as
  // needed to keep every thread busy. Each (query, head) is computed by one item in a fixed
  // order, whatever the grouping, so results depend neither on the batch nor on the thread
  // count.
  constexpr int64_t kQueryBlock = 32;
  // Decode rows are split only while there are fewer of them than threads (batch 1): beyond
  // that whole rows already stream per item, and joining the halves after the loop on one
  // thread cost batch 16 5-15 % of its attention time.
  int64_t decode_rows = 0;
  for (int s = 0; s < nseq; ++s) decode_rows += L.num_tokens(s) == 1;
  const bool split_decode = decode_rows < env.pool.size();
  const auto split = [&](int s) { return split_decode && L.num_tokens(s) == 1; };
  int64_t items_per_group = 0, split_items = 0;
  for (int s = 0; s < nseq; ++s) {
    if (split(s))
      split_items += 2;
    else
      items_per_group += (L.num_tokens(s) + kQueryBlock - 1) / kQueryBlock;
  }
  const int64_t want_groups =
      items_per_group == 0
          ? 1
          : std::clamp<int64_t>((env.pool.size() - std::min<int64_t>(split_items, env.pool.size()) +
                                 items_per_group - 1) /
                                    items_per_group,
                                1, H);
  const int64_t group = (H + want_groups - 1) / want_groups;
  const int64_t groups = (H + group - 1) / group;
  std::vector<int64_t> first_item(static_cast<size_t>(nseq) + 1, 0);
  // The halves of split rows: per split sequence, two parts of [largest H, sum H, acc H * dh].
  const int64_t part_floats = 2 * H + H * dh;
  std::vector<int64_t> split_slot(static_cast<size_t>(nseq), -1);
  int64_t splits = 0;
  for (int s = 0; s < nseq; ++s) {
    if (split(s)) split_slot[s] = splits++;
    const int64_t n_items =
        split(s) ? 2 : groups * ((L.num_tokens(s) + kQueryBlock - 1) / kQueryBlock);
    first_item[s + 1] = first_item[s] + n_items;
  }
  static thread_local std::vector<float> split_parts;
  split_parts.resize(static_cast<size_t>(splits * 2 * part_floats));
  // (A thread_local is not captured: the pool's threads reach it through this pointer.)
  float* const split_base = split_parts.data();
  const auto part_at = [&](int64_t slot, int64_t half) {
    float* base = split_base + (slot * 2 + half) * part_floats;
    return Partial{base, base + H, base + 2 * H};
  };
  // Items are taken from a shared counter rather than split in equal ranges up front: the two
  // vCPUs' speeds differ from call to call, and a static split left one idle. Which thread runs
  // an item does not change its sums.
  const int64_t items = first_item[nseq];
  std::atomic<int64_t> next_item{0};
  const auto attend = [&]<class E>(const std::vector<KeyRows<E>>& rows,
                                   const AttentionRowLoops<E>& row) {
    env.pool.parallel_for(std::min<int64_t>(env.pool.size(), items), 1, [&](int64_t, int64_t) {
      std::vector<float> scores, parts;
      for (;;) {
        const int64_t work = next_item.fetch_add(1, std::memory_order_relaxed);
        if (work >= items) break;
        const int s = static_cast<int>(
            std::upper_bound(first_item.begin(), first_item.end(), work) - first_item.begin() - 1);
        const int64_t local = work - first_item[s];
        const bool halves_apart = split(s);
        const int64_t blocks = (L.num_tokens(s) + kQueryBlock - 1) / kQueryBlock;
        const int64_t h0 = halves_apart ? 0 : local / blocks * group;
        const int64_t h1 = halves_apart ? H : std::min(H, h0 + group), nh = h1 - h0;
        const int64_t q0 = halves_apart ? 0 : (local % blocks) * kQueryBlock;
        const int64_t q1 = halves_apart ? 1 : std::min(L.num_tokens(s), q0 + kQueryBlock);
        const int64_t token_begin = L.token_begin[s];
        const int64_t past = a.kind == AttentionKind::kCachedSelf ? L.past_len[s] : 0;
        const KeyRows<E>& kv = rows[s];
        const int64_t key_len = static_cast<int64_t>(kv.keys.size());
        const int64_t ld = (key_len + 1) / 2;  // the longer half
        scores.resize(static_cast<size_t>(nh * ld));
        parts.resize(static_cast<size_t>(2 * (2 * nh + nh * dh)));
        // Half [j0, j1) of query row i into `out`.
        const auto half = [&](const float* qr, int64_t qpos, int64_t j0, int64_t j1,
                              const Partial& out) {
          const int64_t n = j1 - j0;
          if (n <= 0) {
            std::fill(out.largest, out.largest + nh, -INFINITY);
            std::fill(out.sum, out.sum + nh, 0.0f);
            std::fill(out.acc, out.acc + nh * dh, 0.0f);
            return;
          }
          // Raw scores, key row by key row: scores[(h - h0) * ld + j - j0].
          row.scores(qr, kv.keys.data() + j0, kv.values.data() + j0, h0, nh, dh, n, scores.data(),
                     ld);
          for (int64_t h = h0; h < h1; ++h) {
            float* sc = scores.data() + (h - h0) * ld;
            float mx = -INFINITY;
            switch (a.bias) {
              case PositionBias::kNone:
                mx = scale_and_bias(sc, n, a.scale, 0.0f, j0);
                break;
              case PositionBias::kAlibi:
                mx = scale_and_bias(sc, n, a.scale, slopes[h], j0);
                break;
              case PositionBias::kT5Relative:
                mx = scale_and_add(sc, n, a.scale,
                                   bias_at.data() + h * span + j0 - qpos + farthest_query);
                break;
            }
            out.largest[h - h0] = mx;
            out.sum[h - h0] = exp_shifted(sc, n, mx);
          }
          row.weighted_sum(scores.data(), ld, kv.values.data() + j0, h0, nh, dh, n, out.acc);
        };
        for (int64_t i = q0; i < q1; ++i) {
          const int64_t qpos = past + i;
          const float* qr = q + (token_begin + i) * q_stride;
          const int64_t visible = a.causal ? std::min(key_len, qpos + 1) : key_len;
          const int64_t mid = (visible + 1) / 2;
          if (halves_apart) {
            const int64_t which = local;  // 0: [0, mid), 1: [mid, visible)
            half(qr, qpos, which == 0 ? 0 : mid, which == 0 ? mid : visible,
                 part_at(split_slot[s], which));
            continue;
          }
          float* base = parts.data();
          const Partial p0{base, base + nh, base + 2 * nh};
          base += 2 * nh + nh * dh;
          const Partial p1{base, base + nh, base + 2 * nh};
          half(qr, qpos, 0, mid, p0);
          half(qr, qpos, mid, visible, p1);
          combine(p0, p1, nh, dh, y + (token_begin + i) * width + h0 * dh);
        }
      }
    });
    for (int s = 0; s < nseq; ++s)
      if (split(s))
        combine(part_at(split_slot[s], 0), part_at(split_slot[s], 1), H, dh,
                y + L.token_begin[s] * width);
  };
  if (bf16_kv)
    attend(bf16_rows, loops.bf16);
  else
    attend(rows, loops.f32);
}

}  // namespace
}  // namespace kiln::cpu
