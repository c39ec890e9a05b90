// Decode attention with the warp as the unit (attention.cu's row kernel, re-shaped for steps of
// one query row per sequence): a block per (query row, head, split) as there, but each of its
// warps walks its own chunks of keys, scoring and weighting them in one pass with no block
// barrier until the end. A key row's head slice is read by L lanes (16 bytes each), so a warp
// holds 32 / L keys per round and kRounds rounds of key and value loads are in flight before
// the first is used: a decode step waits for memory about once per chunk, where the row kernel
// waits for the keys, two block reductions, then the values. Each warp keeps its own running
// max and sum (online softmax in fp32); the warps' partial results are joined at the end in
// warp order. Before waiting for the kernel that writes q (programmatic dependent launch), the
// warps ask L2 for the cache rows they will read: those rows were written by earlier steps.
// An fp8 cache (kF8, attention_common.cuh): a lane reads its kPer<T> dimensions of a cached row
// as as many E4M3 codes (8 or 4 bytes) and widens them in pairs; the step's own rows are read
// as T and rounded through E4M3.
#include "backend/cuda/attention_common.cuh"

namespace kiln::cuda {
namespace {

using attn::alibi_slope;
using attn::block_row;
using attn::cache_row;
using attn::cross_row;
using attn::f8_encode;
using attn::f8_round;
using attn::KeyRow;
using attn::position_bias;
using attn::row_keys;
using attn::RowKeys;
using attn::valid_block;

constexpr int kRounds = 4;     // key rounds per chunk, loaded before any is used
constexpr int kMaxWarps = 16;  // per block (512 threads) when the step has a block per SM or less
constexpr int kMidWarps = 8;   // per block at up to two blocks per SM, or few keys (launch_l)
constexpr int kFewWarps = 4;   // KILN_CUDA_ATTN_WARPS=4 (steps of a block per SM or fewer)
constexpr int kManyWarps = 2;  // per block when the step has more than two per SM

template <typename T>
constexpr int kPer = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte load

template <typename T>
__device__ __forceinline__ void unpack16(const uint4& raw, float (&out)[kPer<T>]) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int u = 0; u < kPer<T>; ++u) out[u] = to_float(e[u]);
}

// kPer<T> E4M3 codes (the low kPer<T> bytes of raw) as floats, two per conversion.
template <typename T>
__device__ __forceinline__ void unpack_codes(const uint4& raw, float (&out)[kPer<T>]) {
  const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int u = 0; u < kPer<T> / 2; ++u) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[u], __NV_E4M3)));
    out[2 * u] = f.x;
    out[2 * u + 1] = f.y;
  }
}

// A lane's kPer<T> elements of a key or value row as floats: E4M3 codes (`code`, kF8's cached
// rows), T rounded through E4M3 (kF8's fresh rows), or T.
template <typename T, bool kF8>
__device__ __forceinline__ void unpack_row(const uint4& raw, bool code, float (&out)[kPer<T>]) {
  if constexpr (kF8) {
    if (code) return unpack_codes<T>(raw, out);
    unpack16<T>(raw, out);
#pragma unroll
    for (int u = 0; u < kPer<T>; ++u) out[u] = f8_round(out[u]);
  } else {
    unpack16<T>(raw, out);
  }
}

// Where the key and value rows (head slice) of one key are. `fresh`: a row this step computed
// (p.k / p.v, written by the kernel before this one: read only after pdl_wait).
template <typename T>
struct RowPair {
  const T* key = nullptr;
  const T* value = nullptr;
  bool fresh = false;
};

// The rows of key `key` of sequence s, resolved by one lane for its chunk (null past `last`
// and for a bad cache block, which is reported: the step fails). 32-bit position arithmetic:
// positions and blocks are ints. kF8: a cached row's pointers address its E4M3 codes (held as
// T pointers; load_chunk reads bytes from them).
template <typename T, bool kF8 = false>
__device__ __forceinline__ RowPair<T> resolve(const AttentionParams& p, int s, int key, int last,
                                              int past, int64_t head_off) {
  RowPair<T> r;
  if (key >= last) return r;
  const DeviceStep& st = p.step;
  KeyRow<T> kv{nullptr, nullptr};
  if (p.kind == AttnKind::kCachedSelf && key < past) {
    const int b = st.block_table[static_cast<int64_t>(s) * st.max_blocks + key / p.kv.block_size];
    if (!valid_block(p, b)) {
      report(p.status, kStatusKvBlock, p.node, b, p.kv.capacity);
      return r;
    }
    if constexpr (kF8) {
      const KeyRow<uint8_t> codes = block_row<uint8_t>(p, b, key);
      r.key = reinterpret_cast<const T*>(codes.key + head_off);
      r.value = reinterpret_cast<const T*>(codes.value + head_off);
      return r;
    }
    kv = block_row<T>(p, b, key);
  } else if (p.kind == AttnKind::kCross) {
    kv = cross_row<T>(p, s, key);
  } else {
    // The step's own rows: the encoder's, or this step's new positions of the cached kind.
    const int64_t at = st.token_begin[s] + (key - past);  // a row of the step
    kv = {static_cast<const T*>(p.k) + at * p.kv_stride,
          static_cast<const T*>(p.v) + at * p.kv_stride};
    r.fresh = true;
  }
  r.key = kv.key + head_off;
  r.value = kv.value + head_off;
  return r;
}

// Which of a chunk's rows load_chunk reads: the cache's (before the wait), this step's own
// (after it), or all.
enum class Rows { kCache, kFresh, kAll };

// One chunk's key and value loads: round r, group g reads key r * kGroups + g of the chunk,
// whose rows lane r * kGroups + g resolved. Returns the rounds it loaded, as bits; kF8: `codes`
// gets the bits of the rounds it read as E4M3 codes (cached rows: kPer<T> bytes into the low
// part of kraw / vraw).
template <typename T, int L, bool kF8 = false>
__device__ __forceinline__ unsigned load_chunk(const RowPair<T>& mine, int group, int d0,
                                               Rows which, uint4 (&kraw)[kRounds],
                                               uint4 (&vraw)[kRounds], unsigned& codes) {
  constexpr int kGroups = 32 / L;
  unsigned loaded = 0;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int src = r * kGroups + group;
    const T* k = reinterpret_cast<const T*>(
        __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(mine.key), src));
    const T* v = reinterpret_cast<const T*>(
        __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(mine.value), src));
    const bool fresh = __shfl_sync(0xffffffffu, static_cast<int>(mine.fresh), src) != 0;
    if (k == nullptr || (which == Rows::kCache && fresh) || (which == Rows::kFresh && !fresh))
      continue;
    loaded |= 1u << r;
    if constexpr (kF8) {
      if (!fresh) {
        codes |= 1u << r;
        const uint8_t* kc = reinterpret_cast<const uint8_t*>(k) + d0;
        const uint8_t* vc = reinterpret_cast<const uint8_t*>(v) + d0;
        if constexpr (kPer<T> == 8) {
          const uint2 a = __ldg(reinterpret_cast<const uint2*>(kc));
          const uint2 b = __ldg(reinterpret_cast<const uint2*>(vc));
          kraw[r] = make_uint4(a.x, a.y, 0u, 0u);
          vraw[r] = make_uint4(b.x, b.y, 0u, 0u);
        } else {
          kraw[r] = make_uint4(__ldg(reinterpret_cast<const unsigned*>(kc)), 0u, 0u, 0u);
          vraw[r] = make_uint4(__ldg(reinterpret_cast<const unsigned*>(vc)), 0u, 0u, 0u);
        }
        continue;
      }
      codes &= ~(1u << r);
    }
    kraw[r] = __ldg(reinterpret_cast<const uint4*>(k + d0));
    vraw[r] = __ldg(reinterpret_cast<const uint4*>(v + d0));
  }
  return loaded;
}

// L lanes per key row: head_dim = L * kPer<T>, L a power of two in [4, 32] (a chunk's keys,
// kGroups * kRounds, are at most 32: one lane resolves each). W warps per block. (Holding the
// 4-warp blocks to 64 registers, eight an SM, spilled to L1 and measured no faster.)
template <typename T, int L, int W, bool kF8 = false>
__global__ void __launch_bounds__(W * 32) warp_attention_kernel(AttentionParams p) {
  constexpr int kGroups = 32 / L;  // keys per round
  constexpr int kChunk = kGroups * kRounds;
  static_assert(kChunk <= 32);
  constexpr int kV = kPer<T>;
  const int64_t row = blockIdx.x;
  const int h = blockIdx.y;
  const int split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int warps = W;
  const int group = lane / L, sub = lane % L;
  // The step's layout and the cache rows before `past` (written by earlier steps) are read
  // before the wait for the kernel that wrote q where a kernel ran between the step's uploads
  // and this one (layout_visible); right behind the uploads kernel, this one may start while it
  // still writes the layout (and while the step before still appends to the cache), so it waits
  // first.
  if (!p.layout_visible) pdl_wait();
  const RowKeys rk = row_keys(p, static_cast<int>(row));
  const int s = rk.s, past = rk.past, qpos = rk.qpos, visible = rk.visible;
  const int dh = p.head_dim;
  const int64_t head_off = static_cast<int64_t>(h) * dh;
  const int share = (visible + splits - 1) / splits;
  const int first = min(visible, share * split), last = min(visible, first + share);
  constexpr int stride = warps * kChunk;
  const int d0 = sub * kV;  // this lane's dimensions of the head

  int c0 = first + warp * kChunk;
  RowPair<T> mine = resolve<T, kF8>(p, s, c0 + lane, last, past, head_off);
  uint4 kraw[kRounds], vraw[kRounds];
  unsigned present = 0, codes = 0;
  // Cross K/V may come from a projection earlier in this step: only cache rows are read before
  // the wait.
  const bool cached = p.kind == AttnKind::kCachedSelf;
  if (c0 < last && cached)
    present = load_chunk<T, L, kF8>(mine, group, d0, Rows::kCache, kraw, vraw, codes);

  pdl_wait();
  pdl_trigger();
  float q[kV];
  unpack16<T>(__ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(p.q) + row * p.q_stride +
                                                   head_off + d0)),
              q);
  if (p.kind == AttnKind::kCachedSelf && split == 0 && threadIdx.x < L) {
    // Store this row's key and value of head h in the sequence's cache block (the KV append).
    if constexpr (kF8) {
      const KeyRow<uint8_t> dst = cache_row<uint8_t>(p, s, qpos);
      if (dst.key != nullptr) {
        const T* ks = static_cast<const T*>(p.k) + row * p.kv_stride + head_off + d0;
        const T* vs = static_cast<const T*>(p.v) + row * p.kv_stride + head_off + d0;
        uint8_t* kd = const_cast<uint8_t*>(dst.key) + head_off + d0;
        uint8_t* vd = const_cast<uint8_t*>(dst.value) + head_off + d0;
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          kd[e] = f8_encode(to_float(ks[e]));
          vd[e] = f8_encode(to_float(vs[e]));
        }
      }
    } else if (const KeyRow<T> dst = cache_row<T>(p, s, qpos); dst.key != nullptr) {
      const int64_t src = row * p.kv_stride + head_off + d0;
      *reinterpret_cast<uint4*>(const_cast<T*>(dst.key) + head_off + d0) =
          *reinterpret_cast<const uint4*>(static_cast<const T*>(p.k) + src);
      *reinterpret_cast<uint4*>(const_cast<T*>(dst.value) + head_off + d0) =
          *reinterpret_cast<const uint4*>(static_cast<const T*>(p.v) + src);
    }
  }
  if (c0 < last)
    present |= load_chunk<T, L, kF8>(mine, group, d0, cached ? Rows::kFresh : Rows::kAll, kraw,
                                     vraw, codes);
  const float slope = p.bias == AttnBias::kAlibi ? alibi_slope(h, p.heads) : 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;
  float acc[kV];
#pragma unroll
  for (int e = 0; e < kV; ++e) acc[e] = 0.0f;
  for (; c0 < last; c0 += stride) {
    // The next chunk's rows are resolved while this one's loads are in flight.
    const int next = c0 + stride;
    const RowPair<T> after = resolve<T, kF8>(p, s, next + lane, last, past, head_off);
    float score[kRounds];
    float chunk_max = -INFINITY;
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      float kf[kV];
      unpack_row<T, kF8>(kraw[r], (codes >> r) & 1u, kf);
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kV; ++e) dot = fmaf(q[e], kf[e], dot);
#pragma unroll
      for (int o = L / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      const int key = c0 + r * kGroups + group;
      score[r] =
          (present >> r) & 1u ? dot * p.scale + position_bias(p, key, qpos, h, slope) : -INFINITY;
      chunk_max = fmaxf(chunk_max, score[r]);
    }
#pragma unroll
    for (int o = L; o < 32; o <<= 1)
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, o));
    const float m_new = fmaxf(m_run, chunk_max);
    if (m_new != -INFINITY) {                        // warp-uniform
      const float correction = expf(m_run - m_new);  // 0 while m_run is -inf
      l_run *= correction;
#pragma unroll
      for (int e = 0; e < kV; ++e) acc[e] *= correction;
#pragma unroll
      for (int r = 0; r < kRounds; ++r) {
        // Rounds without a key hold stale registers (possibly NaN): left out, not weighted 0.
        if (((present >> r) & 1u) == 0) continue;
        const float pr = expf(score[r] - m_new);
        l_run += pr;
        float vf[kV];
        unpack_row<T, kF8>(vraw[r], (codes >> r) & 1u, vf);
#pragma unroll
        for (int e = 0; e < kV; ++e) acc[e] = fmaf(pr, vf[e], acc[e]);
      }
      m_run = m_new;
    }
    if (next < last)
      present = load_chunk<T, L, kF8>(after, group, d0, Rows::kAll, kraw, vraw, codes);
  }
  // The warp's groups hold disjoint keys at the same max: add them (lanes of one dimension).
#pragma unroll
  for (int o = L; o < 32; o <<= 1) {
    l_run += __shfl_xor_sync(0xffffffffu, l_run, o);
#pragma unroll
    for (int e = 0; e < kV; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
  }
  // Shared memory: [warps][dh] weighted values, then [warps] maxima and [warps] sums.
  extern __shared__ float join_s[];
  float* m_s = join_s + warps * dh;
  float* l_s = m_s + warps;
  if (group == 0) {
#pragma unroll
    for (int e = 0; e < kV; ++e) join_s[warp * dh + d0 + e] = acc[e];
    if (sub == 0) m_s[warp] = m_run, l_s[warp] = l_run;
  }
  __syncthreads();
  // Join the warps in warp order, each rescaled to the common max.
  float m = -INFINITY;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, m_s[w]);
  float l = 0.0f;
  if (m != -INFINITY)
    for (int w = 0; w < warps; ++w) l += l_s[w] * expf(m_s[w] - m);
  if (splits > 1) {
    // (max, sum, dh weighted values) of this share of the keys, for combine_kernel.
    float* out = p.split_out + ((row * p.heads + h) * splits + split) * (dh + 2);
    if (threadIdx.x == 0) out[0] = m, out[1] = l;
    for (int d = threadIdx.x; d < dh; d += blockDim.x) {
      float v = 0.0f;
      if (m != -INFINITY)
        for (int w = 0; w < warps; ++w) v += join_s[w * dh + d] * expf(m_s[w] - m);
      out[2 + d] = v;
    }
    return;
  }
  T* yr = static_cast<T*>(p.y) + row * static_cast<int64_t>(p.heads) * dh + head_off;
  for (int d = threadIdx.x; d < dh; d += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < warps; ++w) v += join_s[w * dh + d] * expf(m_s[w] - m);
    yr[d] = from_float<T>(v / l);
  }
}

template <typename T, int L, int W>
void launch_w(const AttentionParams& p, dim3 grid, KernelStream stream) {
  const size_t smem = sizeof(float) * static_cast<size_t>(W) * (p.head_dim + 2);
  if (p.kind == AttnKind::kCachedSelf && p.kv.fp8)
    launch(warp_attention_kernel<T, L, W, true>, grid, W * 32, smem, stream, p);
  else
    launch(warp_attention_kernel<T, L, W>, grid, W * 32, smem, stream, p);
}

// Warps per block: as many as keep the step's blocks one wave (about one block of 16 warps, two
// of 8 or five of 4 fit an SM at ~100 registers a thread); beyond two blocks an SM, blocks of 2
// warps: at batch 64 (1024 blocks) on the H200 the step took 1.48 -> 1.39-1.40 ms (bloom-560m)
// and 1.74-1.79 -> 1.59-1.63 ms (flan-t5-large) against 4-warp blocks, and 8 or 16 were slower
// still (bench/gpu/h200-2026-12-01x-attn-*); batches 17-63 were not measured. At a block per SM or
// fewer (batch-1 decode; up to 8 sequences of 16 heads on 132 SMs), 16 only where kMidWarps would
// need a second pass over the keys: on the H200 flan-t5-large's batch-1 decode (up to 100 keys) ran
// 6.6 % faster on 8-warp blocks than on 16, bloom-560m's (79-177 keys) 1.0 % faster with 8 up to
// 128 keys and 16 after, and 1.8 % slower with 8 throughout (a second pass). Batches 2-8 were
// not measured. Forced by KILN_CUDA_ATTN_WARPS for A/B runs.
template <typename T, int L>
void launch_l(const AttentionParams& p, dim3 grid, KernelStream stream) {
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  if (blocks <= p.sms) {
    // As few warps as score the keys in one pass (a block of 16 warps for 100 keys leaves 9
    // idle, holding registers that the next kernel's blocks could use), at least kMidWarps (4
    // was slower on both models). Keys past the last bucket give a key_bound beyond
    // kMaxKeyBuckets * kKeyBucketSize, which is at least what kMidWarps score in one pass.
    constexpr int kChunk = (32 / L) * kRounds;
    static_assert(kMidWarps * kChunk <= kMaxKeyBuckets * kKeyBucketSize);
    const int warps = !warps_follow_keys(blocks, p.sms, p.warps_forced) ? p.warps_forced
                      : p.key_bound > kMidWarps * kChunk                ? kMaxWarps
                                                                        : kMidWarps;
    if (warps >= kMaxWarps) return launch_w<T, L, kMaxWarps>(p, grid, stream);
    if (warps == kMidWarps) return launch_w<T, L, kMidWarps>(p, grid, stream);
    return launch_w<T, L, kFewWarps>(p, grid, stream);
  }
  if (blocks <= 2 * p.sms) return launch_w<T, L, kMidWarps>(p, grid, stream);
  launch_w<T, L, kManyWarps>(p, grid, stream);
}

}  // namespace

template <typename T>
bool launch_warp_attention(const AttentionParams& p, dim3 grid, KernelStream stream) {
  // 16-byte loads of q as well (the caller checked the K/V rows).
  if (!p.warp_rows || p.head_dim % kPer<T> != 0 || p.q_stride % kPer<T> != 0 ||
      (reinterpret_cast<uintptr_t>(p.q) & 15) != 0)
    return false;
  const int lanes = p.head_dim / kPer<T>;
  switch (lanes) {
    case 4:
      launch_l<T, 4>(p, grid, stream);
      return true;
    case 8:
      launch_l<T, 8>(p, grid, stream);
      return true;
    case 16:
      launch_l<T, 16>(p, grid, stream);
      return true;
    case 32:
      launch_l<T, 32>(p, grid, stream);
      return true;
    default:
      return false;
  }
}
template bool launch_warp_attention<float>(const AttentionParams&, dim3, KernelStream);
template bool launch_warp_attention<__half>(const AttentionParams&, dim3, KernelStream);
template bool launch_warp_attention<__nv_bfloat16>(const AttentionParams&, dim3, KernelStream);

}  // namespace kiln::cuda
