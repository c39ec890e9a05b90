// Attention over the step's ragged sequences (encoder self, cached self over the paged KV
// storage, cross over the request's K/V), one block per (query row, head). The block's warps
// take every kWarps-th key; the lanes of a warp split the head dimension, so a key's dot product
// is one warp reduction. Each warp keeps an online softmax (running max, sum and weighted values
// in fp32, as flash attention does) and the warps are merged at the end: no score matrix is
// materialized, and K/V are read once per (query, head). Position bias is computed inside:
// T5's relative buckets from a per-node lookup table of distances, BLOOM's ALiBi from the head's
// slope.
#include "backend/cuda/device_types.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4;

// Where key position j of sequence s lives, for the node's kind; null when its block is invalid.
template <typename T>
struct KeyRow {
  const T* key;
  const T* value;
};

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
      const int b = st.block_table[static_cast<int64_t>(s) * st.max_blocks + j / p.kv.block_size];
      if (b < 0 || b >= p.kv.capacity) {
        report(p.status, kStatusKvBlock, p.node, b, p.kv.capacity);
        return {nullptr, nullptr};
      }
      const int64_t off = (j % p.kv.block_size) * p.kv.row_width;
      const char* base = p.kv.block_base[b];
      return {reinterpret_cast<const T*>(base + 2 * p.layer * p.kv.layer_bytes) + off,
              reinterpret_cast<const T*>(base + (2 * p.layer + 1) * p.kv.layer_bytes) + off};
    }
    case AttnKind::kCross: {
      const int64_t slot = static_cast<int64_t>(s) * st.cross_layers + p.layer;
      const int64_t width = static_cast<int64_t>(p.heads) * p.head_dim;
      return {static_cast<const T*>(st.cross_k[slot]) + j * width,
              static_cast<const T*>(st.cross_v[slot]) + j * width};
    }
  }
  return {nullptr, nullptr};
}

template <typename T>
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

// This step's K/V rows into the sequence's cache blocks.
template <typename T>
__global__ void append_kernel(AttentionParams p) {
  const int64_t r = blockIdx.x;
  const DeviceStep& st = p.step;
  const int s = st.token_seq[r];
  const int64_t pos = st.past_len[s] + (r - st.token_begin[s]);
  const int b = st.block_table[static_cast<int64_t>(s) * st.max_blocks + pos / p.kv.block_size];
  if (b < 0 || b >= p.kv.capacity) {
    if (threadIdx.x == 0) report(p.status, kStatusKvBlock, p.node, b, p.kv.capacity);
    return;
  }
  const int64_t off = (pos % p.kv.block_size) * p.kv.row_width;
  char* base = p.kv.block_base[b];
  T* kd = reinterpret_cast<T*>(base + 2 * p.layer * p.kv.layer_bytes) + off;
  T* vd = reinterpret_cast<T*>(base + (2 * p.layer + 1) * p.kv.layer_bytes) + off;
  const T* ks = static_cast<const T*>(p.k) + r * p.kv_stride;
  const T* vs = static_cast<const T*>(p.v) + r * p.kv_stride;
  for (int64_t c = threadIdx.x; c < p.kv.row_width; c += blockDim.x) {
    kd[c] = ks[c];
    vd[c] = vs[c];
  }
}

template <typename T, int kPerLane>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttentionParams p) {
  const int64_t row = blockIdx.x;
  const int h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const DeviceStep& st = p.step;
  const int s = st.token_seq[row];
  const int64_t i = row - st.token_begin[s];
  const int64_t tokens = st.token_begin[s + 1] - st.token_begin[s];
  const int64_t past = p.kind == AttnKind::kCachedSelf ? st.past_len[s] : 0;
  const int64_t qpos = past + i;
  int64_t key_len = tokens;
  if (p.kind == AttnKind::kCachedSelf) key_len = past + tokens;
  if (p.kind == AttnKind::kCross) key_len = st.cross_len[s];
  const int64_t visible = p.causal ? min(key_len, qpos + 1) : key_len;
  const int dh = p.head_dim;
  const int64_t head_off = static_cast<int64_t>(h) * dh;

  float q[kPerLane], acc[kPerLane];
  const T* qr = static_cast<const T*>(p.q) + row * p.q_stride + head_off;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    q[e] = d < dh ? to_float(qr[d]) : 0.0f;
    acc[e] = 0.0f;
  }
  const float slope = p.bias == AttnBias::kAlibi ? alibi_slope(h, p.heads) : 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < visible; j += kWarps) {
    const KeyRow<T> kv = key_row<T>(p, s, j);
    if (kv.key == nullptr) break;
    const T* kr = kv.key + head_off;
    const T* vr = kv.value + head_off;
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < dh) dot += q[e] * to_float(kr[d]);
    }
    float score = warp_sum(dot) * p.scale;
    if (p.bias == AttnBias::kT5Relative) {
      const int64_t rel = j - qpos;
      const int64_t dist = rel > 0 ? rel : -rel;
      const int64_t n = dist < p.bucket_len ? dist : p.bucket_len - 1;
      const int bucket = rel > 0 ? p.bucket_after[n] : p.bucket_before[n];
      score += table_at<T>(p, static_cast<int64_t>(bucket) * p.heads + h);
    } else if (p.bias == AttnBias::kAlibi) {
      score += slope * static_cast<float>(j);
    }
    const float m_new = fmaxf(m, score);
    const float correction = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float weight = expf(score - m_new);
    l = l * correction + weight;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int d = lane + 32 * e;
      acc[e] = acc[e] * correction + (d < dh ? weight * to_float(vr[d]) : 0.0f);
    }
    m = m_new;
  }

  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_acc[kWarps][kPerLane * 32];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) warp_acc[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  if (warp != 0) return;
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, warp_m[w]);
  float total = 0.0f, factor[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    factor[w] = warp_m[w] == -INFINITY ? 0.0f : expf(warp_m[w] - mx);
    total += warp_l[w] * factor[w];
  }
  const float inv = 1.0f / total;
  T* yr = static_cast<T*>(p.y) + row * static_cast<int64_t>(p.heads) * dh + head_off;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d >= dh) continue;
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w) v += warp_acc[w][d] * factor[w];
    yr[d] = from_float<T>(v * inv);
  }
}

template <typename T>
void launch_typed(const AttentionParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return;
  if (p.kind == AttnKind::kCachedSelf)
    append_kernel<T><<<static_cast<unsigned>(p.tokens), 128, 0, stream>>>(p);
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.heads));
  const int threads = kWarps * 32;
  if (p.head_dim <= 32)
    attention_kernel<T, 1><<<grid, threads, 0, stream>>>(p);
  else if (p.head_dim <= 64)
    attention_kernel<T, 2><<<grid, threads, 0, stream>>>(p);
  else if (p.head_dim <= 128)
    attention_kernel<T, 4><<<grid, threads, 0, stream>>>(p);
  else
    attention_kernel<T, 8><<<grid, threads, 0, stream>>>(p);
}

}  // namespace

void launch_attention(const AttentionParams& p, cudaStream_t stream) {
  dispatch_float(p.act, [&](auto tag) { launch_typed<decltype(tag)>(p, stream); });
}

}  // namespace kiln::cuda
