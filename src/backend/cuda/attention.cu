// Attention over the step's ragged sequences (encoder self, cached self over the paged KV
// storage, which it also appends this step's K/V to, cross over the request's K/V), one block per
// (query row, head) (and split, for long decodes), keys a tile at a time
// with an online softmax across tiles (running max and sum in fp32, as flash attention does):
// no score matrix beyond one tile in shared memory, K/V read once per (query, head). Position
// bias is computed inside: T5's relative buckets from a per-node lookup table of distances,
// BLOOM's ALiBi from the head's slope.
#include <type_traits>

#include "backend/cuda/attention_common.cuh"

namespace kiln::cuda {
namespace {

using attn::alibi_slope;
using attn::cache_row;
using attn::f8_encode;
using attn::f8_round;
using attn::key_row;
using attn::KeyRow;
using attn::position_bias;
using attn::row_keys;
using attn::RowKeys;

// An E4M3 code of an fp8 cache as an element type of its own, so that the row readers below
// (dot_row, load_values) read cache rows of codes as they read rows of T: 16 codes a 16-byte
// load, each widened exactly by to_float.
struct F8Code {
  uint8_t bits;
};
using ::kiln::cuda::to_float;  // the T overloads beside this one
__device__ __forceinline__ float to_float(F8Code c) { return attn::f8_decode(c.bits); }

// q (fp32, shared memory) . k (one key row of dh elements of E: T or F8Code): 16-byte loads
// when the row is aligned for them (rows of 64 fp16 are), up to kKeyLoads of them in flight
// before the first is used; the products are summed in dimension order either way. kRound: each
// key element rounded through E4M3 first (a step's own keys with an fp8 cache).
constexpr int kKeyLoads = 8;
template <typename E, bool kRound = false>
__device__ __forceinline__ float key_element(E e) {
  return kRound ? f8_round(to_float(e)) : to_float(e);
}
template <typename E, bool kRound = false>
__device__ __forceinline__ float dot_row(const float* q, const E* k, int dh) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(E));
  float dot = 0.0f;
  if (dh % kPer == 0 && (reinterpret_cast<uintptr_t>(k) & 15) == 0) {
    const uint4* k4 = reinterpret_cast<const uint4*>(k);
    const int chunks = dh / kPer;
    for (int c0 = 0; c0 < chunks; c0 += kKeyLoads) {
      uint4 raw[kKeyLoads];
#pragma unroll
      for (int u = 0; u < kKeyLoads; ++u)
        if (c0 + u < chunks) raw[u] = __ldg(k4 + c0 + u);
#pragma unroll
      for (int u = 0; u < kKeyLoads; ++u) {
        if (c0 + u >= chunks) break;
        const E* e = reinterpret_cast<const E*>(&raw[u]);
#pragma unroll
        for (int v = 0; v < kPer; ++v) dot += q[(c0 + u) * kPer + v] * key_element<E, kRound>(e[v]);
      }
    }
    return dot;
  }
  for (int d = 0; d < dh; ++d) dot += q[d] * key_element<E, kRound>(k[d]);
  return dot;
}

// Asks for the 128-byte lines of [p, p + bytes) in L2 (a hint; nothing waits for it).
__device__ __forceinline__ void prefetch_lines(const void* p, int bytes) {
  const char* c = static_cast<const char*>(p);
  for (int at = 0; at < bytes; at += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(c + at));
}

// Keys are scored a tile at a time: every thread scores whole keys (q from shared memory, the
// key row read in one pass), the block takes the tile's max and sum (online softmax across
// tiles, in fp32), then the threads split the head dimension and the tile's keys to accumulate
// probability-weighted values: each thread owns W consecutive dimensions (one 16-byte load when
// rows allow, W = 1 otherwise) of every parts-th key, and issues kValueUnroll loads before it
// uses them, so a decode step waits for memory a few times per tile rather than once per key.
// In steps of few blocks (256 threads: batch-1 decode), a thread scoring a key already asks for
// its value row in L2.
constexpr int kTile = 1024;
constexpr int kValueUnroll = 4;

// W elements of a value row of E as floats: one load of W elements (16 bytes for W = 16 /
// sizeof(T) of T; an fp8 cache's W codes 8 or 4 bytes, aligned as the row's W elements of T
// are), or one element.
template <typename E, int W>
__device__ __forceinline__ void load_values(const E* p, float (&out)[W]) {
  constexpr int kBytes = W * static_cast<int>(sizeof(E));
  if constexpr (W == 1 && sizeof(E) == 1) {
    out[0] = to_float(E{__ldg(reinterpret_cast<const unsigned char*>(p))});
  } else if constexpr (W == 1) {
    out[0] = to_float(__ldg(p));
  } else {
    E e[W];
    if constexpr (kBytes == 16)
      *reinterpret_cast<uint4*>(e) = __ldg(reinterpret_cast<const uint4*>(p));
    else if constexpr (kBytes == 8)
      *reinterpret_cast<uint2*>(e) = __ldg(reinterpret_cast<const uint2*>(p));
    else
      *reinterpret_cast<unsigned*>(e) = __ldg(reinterpret_cast<const unsigned*>(p));
#pragma unroll
    for (int u = 0; u < W; ++u) out[u] = to_float(e[u]);
  }
}

// Value row `row` (kF8: E4M3 codes when `cached`, else the step's row of T rounded through
// E4M3), elements off .. off + W - 1, as floats.
template <typename T, int W, bool kF8>
__device__ __forceinline__ void load_value_row(const void* row, bool cached, int64_t off,
                                               float (&out)[W]) {
  if constexpr (kF8) {
    if (cached) return load_values<F8Code, W>(static_cast<const F8Code*>(row) + off, out);
    load_values<T, W>(static_cast<const T*>(row) + off, out);
#pragma unroll
    for (int u = 0; u < W; ++u) out[u] = f8_round(out[u]);
  } else {
    load_values<T, W>(static_cast<const T*>(row) + off, out);
  }
}

// Split along the keys (gridDim.z > 1, decode over long contexts): block z covers an equal
// share of the visible keys and leaves its unnormalised (max, sum, weighted values) in
// p.split_out for combine_kernel; with one split the block normalises and writes y itself.
// kF8: cached self attention over an fp8 cache (attention_common.cuh).
template <typename T, int W, bool kF8 = false>
__global__ void attention_kernel(AttentionParams p) {
  pdl_begin();
  const int64_t row = blockIdx.x;
  const int h = blockIdx.y;
  const int split = blockIdx.z, splits = gridDim.z;
  const int tid = threadIdx.x, threads = blockDim.x;
  const RowKeys rk = row_keys(p, static_cast<int>(row));
  const int s = rk.s;
  const int64_t qpos = rk.qpos, visible = rk.visible;
  const int dh = p.head_dim;
  const int64_t head_off = static_cast<int64_t>(h) * dh;

  __shared__ float q_s[kMaxHeadDim];
  __shared__ float score_s[kTile];
  __shared__ const void* value_s[kTile];  // each key's value row, resolved once while scoring
  __shared__ float partial_s[256 * W];    // parts * dh = (threads / (dh / W)) * dh <= 256 * W
  __shared__ int bad_block;
  const T* qr = static_cast<const T*>(p.q) + row * p.q_stride + head_off;
  for (int d = tid; d < dh; d += threads) q_s[d] = to_float(qr[d]);
  if (tid == 0) bad_block = 0;
  if (kF8 && split == 0) {
    // The KV append as below, into E4M3 codes.
    const KeyRow<F8Code> dst = cache_row<F8Code>(p, s, qpos);
    if (dst.key != nullptr) {
      F8Code* kd = const_cast<F8Code*>(dst.key) + head_off;
      F8Code* vd = const_cast<F8Code*>(dst.value) + head_off;
      const T* ks = static_cast<const T*>(p.k) + row * p.kv_stride + head_off;
      const T* vs = static_cast<const T*>(p.v) + row * p.kv_stride + head_off;
      for (int d = tid; d < dh; d += threads) {
        kd[d] = F8Code{f8_encode(to_float(ks[d]))};
        vd[d] = F8Code{f8_encode(to_float(vs[d]))};
      }
    }
  } else if (p.kind == AttnKind::kCachedSelf && split == 0) {
    // Store this row's key and value of head h in the sequence's cache block (the KV append,
    // fused: no separate kernel per layer).
    const KeyRow<T> dst = cache_row<T>(p, s, qpos);
    if (dst.key != nullptr) {
      // The cache rows are this kernel's to write (KeyRow holds them as const for readers).
      T* kd = const_cast<T*>(dst.key) + head_off;
      T* vd = const_cast<T*>(dst.value) + head_off;
      const T* ks = static_cast<const T*>(p.k) + row * p.kv_stride + head_off;
      const T* vs = static_cast<const T*>(p.v) + row * p.kv_stride + head_off;
      for (int d = tid; d < dh; d += threads) {
        kd[d] = ks[d];
        vd[d] = vs[d];
      }
    }
  }
  __syncthreads();
  const float slope = p.bias == AttnBias::kAlibi ? alibi_slope(h, p.heads) : 0.0f;
  const bool few_blocks = threads == 256;
  // The value threads: thread tid accumulates dimensions vd .. vd + W - 1 over keys part,
  // part + parts, ...
  const int lanes = dh / W;  // threads per key (<= threads: dh <= the block's threads)
  const int parts = threads / lanes;
  const int vd = (tid % lanes) * W, part = tid / lanes;
  const bool value_thread = part < parts;
  float m_run = -INFINITY, l_run = 0.0f;
  float acc[W];
#pragma unroll
  for (int u = 0; u < W; ++u) acc[u] = 0.0f;
  const int64_t share = (visible + splits - 1) / splits;
  const int64_t first = min(visible, share * split), last = min(visible, first + share);
  for (int64_t tile0 = first; tile0 < last; tile0 += kTile) {
    const int n = static_cast<int>(min(static_cast<int64_t>(kTile), last - tile0));
    float local_max = -INFINITY;
    for (int j = tid; j < n; j += threads) {
      const int64_t key = tile0 + j;
      float score = -INFINITY;
      if constexpr (kF8) {
        if (key < rk.past) {
          const KeyRow<F8Code> kv = cache_row<F8Code>(p, s, key);
          value_s[j] = kv.value;
          if (kv.key == nullptr) {
            bad_block = 1;
          } else {
            if (few_blocks) prefetch_lines(kv.value + head_off, dh);
            score = dot_row(q_s, kv.key + head_off, dh) * p.scale +
                    position_bias(p, key, qpos, h, slope);
          }
        } else {
          const KeyRow<T> kv = key_row<T>(p, s, key);  // the step's own row
          value_s[j] = kv.value;
          score = dot_row<T, true>(q_s, kv.key + head_off, dh) * p.scale +
                  position_bias(p, key, qpos, h, slope);
        }
      } else {
        const KeyRow<T> kv = key_row<T>(p, s, key);
        value_s[j] = kv.value;
        if (kv.key == nullptr) {
          bad_block = 1;
        } else {
          if (few_blocks) prefetch_lines(kv.value + head_off, dh * static_cast<int>(sizeof(T)));
          score =
              dot_row(q_s, kv.key + head_off, dh) * p.scale + position_bias(p, key, qpos, h, slope);
        }
      }
      score_s[j] = score;
      local_max = fmaxf(local_max, score);
    }
    const float tile_max = block_max(local_max);
    if (bad_block) return;  // reported by key_row; the step fails
    const float m_new = fmaxf(m_run, tile_max);
    const float correction = expf(m_run - m_new);  // 0 for the first tile (m_run = -inf)
    float local_sum = 0.0f;
    for (int j = tid; j < n; j += threads) {
      const float e = expf(score_s[j] - m_new);
      score_s[j] = e;
      local_sum += e;
    }
    const float tile_sum = block_sum(local_sum);  // its barriers publish score_s
    l_run = l_run * correction + tile_sum;
#pragma unroll
    for (int u = 0; u < W; ++u) acc[u] *= correction;
    if (value_thread) {
      int j = part;
      for (; j + (kValueUnroll - 1) * parts < n; j += kValueUnroll * parts) {
        float v[kValueUnroll][W];
#pragma unroll
        for (int k = 0; k < kValueUnroll; ++k)
          load_value_row<T, W, kF8>(value_s[j + k * parts], tile0 + j + k * parts < rk.past,
                                    head_off + vd, v[k]);
#pragma unroll
        for (int k = 0; k < kValueUnroll; ++k) {
          const float pk = score_s[j + k * parts];
#pragma unroll
          for (int u = 0; u < W; ++u) acc[u] += pk * v[k][u];
        }
      }
      for (; j < n; j += parts) {
        float v[W];
        load_value_row<T, W, kF8>(value_s[j], tile0 + j < rk.past, head_off + vd, v);
        const float pj = score_s[j];
#pragma unroll
        for (int u = 0; u < W; ++u) acc[u] += pj * v[u];
      }
    }
    m_run = m_new;
    __syncthreads();  // score_s is rewritten by the next tile
  }
  // Sum the parts of each dimension, in a fixed order.
  if (value_thread)
#pragma unroll
    for (int u = 0; u < W; ++u) partial_s[part * dh + vd + u] = acc[u];
  __syncthreads();
  if (splits > 1) {
    // (max, sum, dh weighted values) of this share of the keys.
    float* out = p.split_out + ((row * p.heads + h) * splits + split) * (dh + 2);
    if (tid == 0) out[0] = m_run, out[1] = l_run;
    for (int d = tid; d < dh; d += threads) {
      float v = 0.0f;
      for (int k = 0; k < parts; ++k) v += partial_s[k * dh + d];
      out[2 + d] = v;
    }
    return;
  }
  T* yr = static_cast<T*>(p.y) + row * static_cast<int64_t>(p.heads) * dh + head_off;
  for (int d = tid; d < dh; d += threads) {
    float v = 0.0f;
    for (int k = 0; k < parts; ++k) v += partial_s[k * dh + d];
    yr[d] = from_float<T>(v / l_run);
  }
}

// Joins the splits of one (row, head): rescales each share's sums to the common max, in split
// order.
template <typename T>
__global__ void combine_kernel(AttentionParams p, int splits) {
  pdl_begin();
  const int64_t row = blockIdx.x;
  const int h = blockIdx.y, dh = p.head_dim;
  const float* in = p.split_out + (row * p.heads + h) * splits * (dh + 2);
  float m = -INFINITY;
  for (int z = 0; z < splits; ++z) m = fmaxf(m, in[z * (dh + 2)]);
  float l = 0.0f;
  for (int z = 0; z < splits; ++z) l += in[z * (dh + 2) + 1] * expf(in[z * (dh + 2)] - m);
  T* yr = static_cast<T*>(p.y) + (row * p.heads + h) * static_cast<int64_t>(dh);
  for (int d = threadIdx.x; d < dh; d += blockDim.x) {
    float v = 0.0f;
    for (int z = 0; z < splits; ++z) v += in[z * (dh + 2) + 2 + d] * expf(in[z * (dh + 2)] - m);
    yr[d] = from_float<T>(v / l);
  }
}

template <typename T>
void launch_typed(const AttentionParams& p, KernelStream stream) {
  if (p.tokens == 0) return;
  if constexpr (!std::is_same_v<T, float>) {
    if (tiled_attention_applies(p)) {
      launch_tiled_attention<T>(p, stream);
      return;
    }
  }
  const int splits = attention_splits(p.tokens, p.heads, p.key_class, p.split_capacity);
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(splits));
  // A step of few (row, head, split) blocks (batch-1 decode) gives each 256 threads: it scores up
  // to 256 keys in one round of loads and accumulates values over 32 (dh 64) key parts; many
  // blocks (batched decode, prompts) take 128 each, so that more of them fit an SM at once.
  const int threads = p.tokens * p.heads * splits <= kSplitBlocks ? 256 : 128;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  // 16-byte value loads need every value row's head slice 16-byte aligned: the head dimension
  // and the row strides in whole chunks (the buffers themselves are 256-byte aligned).
  const int64_t row_elems = p.kind == AttnKind::kCachedSelf ? p.kv.row_width
                            : p.kind == AttnKind::kCross
                                ? static_cast<int64_t>(p.heads) * p.head_dim
                                : p.kv_stride;
  // Cached self attention reads this step's own values from the step's rows (p.v) as well.
  const bool step_rows_ok =
      p.kind == AttnKind::kCross ||
      (p.kv_stride % kVec == 0 && (reinterpret_cast<uintptr_t>(p.v) & 15) == 0);
  const bool vec = p.head_dim % kVec == 0 && row_elems % kVec == 0 && step_rows_ok;
  // The warp kernel where it fits, else the row kernel (their fp8 instances for an fp8 cache).
  const bool f8 = p.kind == AttnKind::kCachedSelf && p.kv.fp8;
  if (!vec || !launch_warp_attention<T>(p, grid, stream)) {
    if (f8 && vec)
      launch(attention_kernel<T, kVec, true>, grid, threads, 0, stream, p);
    else if (f8)
      launch(attention_kernel<T, 1, true>, grid, threads, 0, stream, p);
    else if (vec)
      launch(attention_kernel<T, kVec>, grid, threads, 0, stream, p);
    else
      launch(attention_kernel<T, 1>, grid, threads, 0, stream, p);
  }
  if (splits > 1) launch(combine_kernel<T>, dim3(grid.x, grid.y), threads, 0, stream, p, splits);
}

}  // namespace

int attention_splits(int64_t tokens, int heads, int key_class, int64_t capacity) {
  // Split only when the (row, head) blocks leave most SMs idle and the keys are many: each share
  // keeps at least kSplitKeys keys. key_class is log2 of ceil(longest keys / kSplitKeys).
  const int64_t blocks = tokens * heads;
  int splits = 1;
  while (splits < kMaxSplits && splits < (1 << key_class) && blocks * splits * 2 <= kSplitBlocks &&
         blocks * splits * 2 <= capacity)
    splits *= 2;
  return splits;
}

void launch_attention(const AttentionParams& p, KernelStream stream) {
  dispatch_float(p.act, [&](auto tag) { launch_typed<decltype(tag)>(p, stream); });
}

}  // namespace kiln::cuda
