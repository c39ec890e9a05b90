// Device helpers both attention kernels use (attention.cu: a block per query row;
// attention_tiled.cu: tensor-core tiles for prompts): where a key row lives for each kind of
// attention (the step's rows, the paged cache, the request's cross K/V) and the position bias
// added to a score (T5's relative buckets, BLOOM's ALiBi).
#pragma once

#include <cuda_fp8.h>

#include "backend/cuda/device_types.cuh"

namespace kiln::cuda {
namespace attn {

// The keys query row `row` of the step sees: its sequence s, the sequence's cached positions
// (cached self attention; 0 otherwise), the query's position and how many keys it attends to
// (causal: up to and including its own). Ints, as the step's layout holds them.
struct RowKeys {
  int s, past, qpos, visible;
};
__device__ __forceinline__ RowKeys row_keys(const AttentionParams& p, int row) {
  const DeviceStep& st = p.step;
  const int s = st.token_seq[row];
  const int i = row - st.token_begin[s];
  const int tokens = st.token_begin[s + 1] - st.token_begin[s];
  const int past = p.kind == AttnKind::kCachedSelf ? st.past_len[s] : 0;
  const int qpos = past + i;
  int key_len = tokens;
  if (p.kind == AttnKind::kCachedSelf) key_len = past + tokens;
  if (p.kind == AttnKind::kCross) key_len = st.cross_len[s];
  return {s, past, qpos, p.causal ? min(key_len, qpos + 1) : key_len};
}

// Where key position j of sequence s lives, for the node's kind; null when its block is invalid.
template <typename T>
struct KeyRow {
  const T* key;
  const T* value;
};

// The cache block holding position j of sequence s (may be invalid: see valid_block).
__device__ __forceinline__ int cache_block(const AttentionParams& p, int s, int64_t j) {
  const DeviceStep& st = p.step;
  return st.block_table[static_cast<int64_t>(s) * st.max_blocks + j / p.kv.block_size];
}
__device__ __forceinline__ bool valid_block(const AttentionParams& p, int b) {
  return b >= 0 && b < p.kv.capacity;
}
// This layer's key and value rows of position j in (valid) block b.
template <typename T>
__device__ __forceinline__ KeyRow<T> block_row(const AttentionParams& p, int b, int64_t j) {
  const int64_t off = (j % p.kv.block_size) * p.kv.row_width;
  const char* base = p.kv.block_base[b];
  return {reinterpret_cast<const T*>(base + 2 * p.layer * p.kv.layer_bytes) + off,
          reinterpret_cast<const T*>(base + (2 * p.layer + 1) * p.kv.layer_bytes) + off};
}

// Where position j of sequence s lives in the paged cache (this layer's key and value rows);
// null, and reported, when its block is invalid.
template <typename T>
__device__ __forceinline__ KeyRow<T> cache_row(const AttentionParams& p, int s, int64_t j) {
  const int b = cache_block(p, s, j);
  if (!valid_block(p, b)) {
    report(p.status, kStatusKvBlock, p.node, b, p.kv.capacity);
    return {nullptr, nullptr};
  }
  return block_row<T>(p, b, j);
}

// Key position j of sequence s in the request's cross K/V (this layer's).
template <typename T>
__device__ __forceinline__ KeyRow<T> cross_row(const AttentionParams& p, int s, int64_t j) {
  const DeviceStep& st = p.step;
  const int64_t slot = static_cast<int64_t>(s) * st.cross_layers + p.layer;
  const int64_t width = static_cast<int64_t>(p.heads) * p.head_dim;
  return {static_cast<const T*>(st.cross_k[slot]) + j * width,
          static_cast<const T*>(st.cross_v[slot]) + j * width};
}

template <typename T>
__device__ __forceinline__ KeyRow<T> key_row(const AttentionParams& p, int s, int64_t j) {
  const DeviceStep& st = p.step;
  switch (p.kind) {
    case AttnKind::kEncoderSelf: {
      const int64_t r = st.token_begin[s] + j;
      return {static_cast<const T*>(p.k) + r * p.kv_stride,
              static_cast<const T*>(p.v) + r * p.kv_stride};
    }
    case AttnKind::kCachedSelf: {
      // This step's own keys are read where the step computed them: the blocks that store them
      // in the cache (split 0 of each (row, head)) run concurrently with the ones reading.
      const int64_t past = st.past_len[s];
      if (j >= past) {
        const int64_t r = st.token_begin[s] + (j - past);
        return {static_cast<const T*>(p.k) + r * p.kv_stride,
                static_cast<const T*>(p.v) + r * p.kv_stride};
      }
      return cache_row<T>(p, s, j);
    }
    case AttnKind::kCross:
      return cross_row<T>(p, s, j);
  }
  return {nullptr, nullptr};
}

// An fp8 KV cache (p.kv.fp8, --kv-cache fp8): keys and values stored as E4M3 codes with a scale
// of 1 (rounded to nearest even, saturating at ±448), widened exactly as they are read. A step's
// own keys and values are read from its rows (the blocks storing them run concurrently with the
// ones reading), rounded through E4M3 the same way, so that a key counts the same in the step
// that writes it and in every later one — what the reference backend does by reading them back
// from its cache.
__device__ __forceinline__ uint8_t f8_encode(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float f8_decode(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}
__device__ __forceinline__ float f8_round(float x) { return f8_decode(f8_encode(x)); }

__device__ __forceinline__ float table_at(const AttentionParams& p, int64_t i) {
  switch (p.table_type) {
    case FloatType::kF32:
      return static_cast<const float*>(p.rel_table)[i];
    case FloatType::kF16:
      return __half2float(static_cast<const __half*>(p.rel_table)[i]);
    case FloatType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p.rel_table)[i]);
  }
  return 0.0f;
}

__device__ __forceinline__ float alibi_slope(int h, int heads) {
  int pow2 = 1;
  while (pow2 * 2 <= heads) pow2 *= 2;
  if (h < pow2) return exp2f(-8.0f * static_cast<float>(h + 1) / static_cast<float>(pow2));
  return exp2f(-4.0f * static_cast<float>(2 * (h - pow2) + 1) / static_cast<float>(pow2));
}

// T5: the bias of head h for a key rel = key - query positions away (the node's bucket table).
__device__ __forceinline__ float relative_bias(const AttentionParams& p, int64_t rel, int h) {
  const int64_t dist = rel > 0 ? rel : -rel;
  const int64_t nb = dist < p.bucket_len ? dist : p.bucket_len - 1;
  const int bucket = rel > 0 ? p.bucket_after[nb] : p.bucket_before[nb];
  return table_at(p, static_cast<int64_t>(bucket) * p.heads + h);
}

// The bias added to the score of key position `key` for the query at position `qpos`, head h:
// T5's relative bucket from the node's table, or ALiBi's slope * key.
__device__ __forceinline__ float position_bias(const AttentionParams& p, int64_t key, int64_t qpos,
                                               int h, float slope) {
  if (p.bias == AttnBias::kT5Relative) return relative_bias(p, key - qpos, h);
  if (p.bias == AttnBias::kAlibi) return slope * static_cast<float>(key);
  return 0.0f;
}

}  // namespace attn

// Whether a step's attention goes to the tensor-core kernel (attention_tiled.cu): fp16/bf16
// self attention of head_dim 64 or 128, rows aligned for 16-byte loads, and (p.tiled kAuto)
// prompts: sequences of 16 rows or more on average, enough (tile, head) blocks to fill the GPU.
bool tiled_attention_applies(const AttentionParams& p);
template <typename T>
void launch_tiled_attention(const AttentionParams& p, KernelStream stream);
// The warp kernel (attention_warps.cu) for the (row, head, split) grid of attention.cu's row
// kernel, when p.warp_rows and the head fits it (head_dim / (16 / sizeof(T)) lanes a key, a
// power of two up to 32; q, K and V rows aligned for 16-byte loads, which the caller checked
// for K and V; an fp8 cache's codes as 8- or 4-byte loads); false, launching nothing,
// otherwise.
template <typename T>
bool launch_warp_attention(const AttentionParams& p, dim3 grid, KernelStream stream);

}  // namespace kiln::cuda
