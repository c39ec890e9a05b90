// Attention over prompts on tensor cores (fp16/bf16, head_dim 64 or 128): a block per (64 or 32
// query rows of one sequence, head), a warp per 16 rows, keys in tiles of 64 through shared
// memory. Per tile, S = Q·Kᵀ on tensor cores (fp32 accumulation); then, per row in fp32, the
// scale, the position bias (T5's buckets, ALiBi), the causal and length masks and an online
// softmax (running max and sum, as flash attention does); then O += P·V on tensor cores, with P
// rounded to the activation type as HuggingFace's eager attention rounds its probabilities before
// they multiply the values. No score matrix beyond a tile; each key row is read once per 32 or 64
// queries instead of once per query as the row kernel (attention.cu) reads it. Cached self
// attention also stores its rows' K/V of the head in the paged cache. S, P and O stay in
// registers (mma.sync fragments: a warp's 16 rows, its quads' lanes sharing a row), and each K/V
// tile comes in through cp.async with all of a thread's chunks in flight at once.
#include "backend/cuda/attention_common.cuh"

namespace kiln::cuda {
namespace {

using attn::alibi_slope;
using attn::cache_row;
using attn::f8_decode;
using attn::f8_encode;
using attn::key_row;
using attn::KeyRow;

constexpr int kKeys = 64;  // keys per tile
// A step takes the tiled kernel when its sequences average at least this many rows (prompts);
// decode steps (a row or a few per sequence) keep the row kernel.
constexpr int64_t kMinRowsPerSeq = 16;
// ... and fill the GPU: at least this many (query tile, head) blocks (a batch-1 prompt of 78
// tokens, 32 blocks, runs faster on the row kernel's 1248).
constexpr int64_t kMinBlocks = 256;

// K and V tiles in shared memory, row pitch padded by 8 elements (16 bytes): the fragment loads
// below (a row per lane group) then touch every bank once.
template <int DH>
constexpr int kPitch = DH + 8;

__device__ __forceinline__ uint4 load16(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void store16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }
// 16 bytes from global to shared memory without passing through registers (cp.async, sm_80+):
// a thread's chunks of a tile are all in flight at once, where a load and a store per chunk
// wait for each load in turn. src null: the chunk is zero-filled (nothing is read; `any` is a
// valid address to name).
__device__ __forceinline__ void copy16_async(void* dst, const void* src, const void* any) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  const int bytes = src != nullptr ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to),
               "l"(src != nullptr ? src : any), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void copies_done() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ uint32_t load32(const void* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// An fp8 cache (attention_common.cuh): a 16-byte chunk of 8 T as 8 E4M3 codes, and 8 codes as 8
// T (exact: E4M3 values are fp16 and bf16 values); decode8(encode8(c)) rounds a chunk of T
// through E4M3.
template <typename T>
__device__ __forceinline__ uint2 encode8(uint4 chunk) {
  const T* e = reinterpret_cast<const T*>(&chunk);
  uint2 out;
  uint8_t* c = reinterpret_cast<uint8_t*>(&out);
#pragma unroll
  for (int u = 0; u < 8; ++u) c[u] = f8_encode(to_float(e[u]));
  return out;
}
template <typename T>
__device__ __forceinline__ uint4 decode8(uint2 codes) {
  const uint8_t* c = reinterpret_cast<const uint8_t*>(&codes);
  uint4 out;
  T* e = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int u = 0; u < 8; ++u) e[u] = from_float<T>(f8_decode(c[u]));
  return out;
}

// Two values as one register of the activation type (the mma operand layout: low half first).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  T pair[2] = {from_float<T>(lo), from_float<T>(hi)};
  return *reinterpret_cast<const uint32_t*>(pair);
}

// The B operand of P · V for 16 keys and 8 dimensions: V's rows are keys, so the fragment is
// V transposed (ldmatrix .trans); lanes 0-15 name the 16 key rows at dimension d0.
__device__ __forceinline__ void load_v_fragment(const void* row, uint32_t& b0, uint32_t& b1) {
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b0), "=r"(b1)
               : "r"(at));
}

// Head dim 64 is held to 128 registers a thread: four blocks of 64 rows an SM (16 warps).
// kF8: cached self attention over an fp8 cache, whose tiles are widened through registers
// instead of cp.async.
template <typename T, int DH, int kRows, bool kF8 = false>
__global__ void __launch_bounds__(kRows * 2, DH == 64 ? 4 * 64 / kRows : 1)
    tiled_attention_kernel(AttentionParams p, int seq_tiles) {
  constexpr int kThreads = kRows * 2;                     // a warp per 16 query rows
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte chunk
  constexpr int kChunks = DH / kPer;                      // chunks per head row
  constexpr int ldt = kPitch<DH>;
  __shared__ __align__(16) T k_s[kKeys * ldt];
  __shared__ __align__(16) T v_s[kKeys * ldt];
  // T5: the bias of every distance key - query a tile spans (-(kRows - 1) .. 63), per tile.
  __shared__ float rel_s[kRows + kKeys - 1];
  pdl_begin();
  const DeviceStep& st = p.step;
  // Block x has query tile x % seq_tiles of sequence x / seq_tiles (seq_tiles: the most any
  // sequence of the step can have); tiles past a sequence's end have nothing to do.
  const int s = static_cast<int>(blockIdx.x / seq_tiles);
  const int64_t i0 = static_cast<int64_t>(blockIdx.x % seq_tiles) * kRows;
  if (s >= st.num_seqs) return;
  const int64_t begin = st.token_begin[s];
  const int64_t tokens = st.token_begin[s + 1] - begin;
  if (i0 >= tokens) return;
  const int h = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // fragment row group and column pair
  const int rows = static_cast<int>(min(static_cast<int64_t>(kRows), tokens - i0));
  const int64_t past = p.kind == AttnKind::kCachedSelf ? st.past_len[s] : 0;
  const int64_t key_len = past + tokens;
  const int64_t q0 = past + i0;  // position of the block's first query
  const int64_t key_end = p.causal ? min(key_len, q0 + rows) : key_len;
  const int64_t head_off = static_cast<int64_t>(h) * DH;

  if (p.kind == AttnKind::kCachedSelf) {
    // The rows' key and value of head h into the sequence's cache blocks (the KV append: this
    // step's keys are read below from the step's rows, so nothing waits for these stores).
    // All of a thread's loads are issued before its first store.
    constexpr int kAppend = (kRows * kChunks + kThreads - 1) / kThreads;
    uint4 kc[kAppend], vc[kAppend];
#pragma unroll
    for (int i = 0; i < kAppend; ++i) {
      const int c = tid + i * kThreads, r = c / kChunks, part = c % kChunks;
      if (r >= rows) continue;
      const int64_t src = (begin + i0 + r) * p.kv_stride + head_off + part * kPer;
      kc[i] = load16(static_cast<const T*>(p.k) + src);
      vc[i] = load16(static_cast<const T*>(p.v) + src);
    }
#pragma unroll
    for (int i = 0; i < kAppend; ++i) {
      const int c = tid + i * kThreads, r = c / kChunks, part = c % kChunks;
      if (r >= rows) continue;
      if constexpr (kF8) {
        const KeyRow<uint8_t> dst = cache_row<uint8_t>(p, s, q0 + r);
        if (dst.key == nullptr) continue;  // reported by cache_row: the step fails
        *reinterpret_cast<uint2*>(const_cast<uint8_t*>(dst.key) + head_off + part * kPer) =
            encode8<T>(kc[i]);
        *reinterpret_cast<uint2*>(const_cast<uint8_t*>(dst.value) + head_off + part * kPer) =
            encode8<T>(vc[i]);
      } else {
        const KeyRow<T> dst = cache_row<T>(p, s, q0 + r);
        if (dst.key == nullptr) continue;  // reported by cache_row: the step fails
        store16(const_cast<T*>(dst.key) + head_off + part * kPer, kc[i]);
        store16(const_cast<T*>(dst.value) + head_off + part * kPer, vc[i]);
      }
    }
  }
  // This warp's 16 query rows as A fragments, straight from memory (rows past the sequence's
  // end are zeros: they attend to nothing and are never written). Lane rows ra and ra + 8.
  const int ra = warp * 16 + g, rb = ra + 8;
  const bool real_a = ra < rows, real_b = rb < rows;
  const T* qa = static_cast<const T*>(p.q) + (begin + i0 + ra) * p.q_stride + head_off;
  const T* qb = qa + 8 * p.q_stride;
  uint32_t qf[DH / 16][4];
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk) {
    const int c = kk * 16 + 2 * t;
    qf[kk][0] = real_a ? load32(qa + c) : 0u;
    qf[kk][1] = real_b ? load32(qb + c) : 0u;
    qf[kk][2] = real_a ? load32(qa + c + 8) : 0u;
    qf[kk][3] = real_b ? load32(qb + c + 8) : 0u;
  }
  const int64_t pos_a = q0 + ra, pos_b = q0 + rb;
  const int64_t visible_a = p.causal ? min(key_len, pos_a + 1) : key_len;
  const int64_t visible_b = p.causal ? min(key_len, pos_b + 1) : key_len;
  const float slope = p.bias == AttnBias::kAlibi ? alibi_slope(h, p.heads) : 0.0f;
  // Running max and sum of rows ra and rb (each lane of a quad holds the same), and the output
  // accumulators: dimension group n, columns 2t and 2t + 1 of rows ra (0, 1) and rb (2, 3).
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float o[DH / 8][4];
#pragma unroll
  for (int n = 0; n < DH / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  bool bad_block = false;  // this thread met a cache block that does not exist
  for (int64_t j0 = 0; j0 < key_end; j0 += kKeys) {
    // K and V rows j0 .. j0 + 63 of head h (zeros past the keys this block may see).
    for (int c = tid; kF8 && c < kKeys * kChunks; c += kThreads) {
      // An fp8 cache: cached keys widened, the step's own rounded through E4M3 (zeros: keys
      // this block may not see).
      const int kr = c / kChunks, part = c % kChunks;
      const int64_t key = j0 + kr;
      uint4 kc{}, vc{};
      if (key < past) {
        const KeyRow<uint8_t> row = cache_row<uint8_t>(p, s, key);
        if (row.key == nullptr) {
          bad_block = true;
        } else {
          kc = decode8<T>(*reinterpret_cast<const uint2*>(row.key + head_off + part * kPer));
          vc = decode8<T>(*reinterpret_cast<const uint2*>(row.value + head_off + part * kPer));
        }
      } else if (key < key_end) {
        const int64_t src = (begin + key - past) * p.kv_stride + head_off + part * kPer;
        kc = decode8<T>(encode8<T>(load16(static_cast<const T*>(p.k) + src)));
        vc = decode8<T>(encode8<T>(load16(static_cast<const T*>(p.v) + src)));
      }
      store16(k_s + kr * ldt + part * kPer, kc);
      store16(v_s + kr * ldt + part * kPer, vc);
    }
    for (int c = tid; !kF8 && c < kKeys * kChunks; c += kThreads) {
      const int kr = c / kChunks, part = c % kChunks;
      const int64_t key = j0 + kr;
      const T *kc = nullptr, *vc = nullptr;  // zeros: keys this block may not see
      if (key < key_end) {
        const KeyRow<T> row = key_row<T>(p, s, key);
        if (row.key == nullptr) {
          bad_block = true;
        } else {
          kc = row.key + head_off + part * kPer;
          vc = row.value + head_off + part * kPer;
        }
      }
      copy16_async(k_s + kr * ldt + part * kPer, kc, p.q);
      copy16_async(v_s + kr * ldt + part * kPer, vc, p.q);
    }
    // The bias table's lookups overlap the copies.
    if (p.bias == AttnBias::kT5Relative)
      for (int e = tid; e < kRows + kKeys - 1; e += kThreads)
        rel_s[e] = attn::relative_bias(p, j0 - q0 + e - (kRows - 1), h);
    copies_done();
    if (__syncthreads_or(bad_block)) return;  // reported by key_row; the step fails

    // S (16 rows x 64 keys of this warp) = Q · Kᵀ, in fragments: key group n holds keys
    // j0 + 8n + 2t and + 1 of rows ra (x[n][0], x[n][1]) and rb (x[n][2], x[n][3]).
    float x[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.0f;
      const T* krow = k_s + (n * 8 + g) * ldt + 2 * t;
#pragma unroll
      for (int kk = 0; kk < DH / 16; ++kk)
        mma16816<T>(x[n], qf[kk], load32(krow + kk * 16), load32(krow + kk * 16 + 8));
    }
    // Scale, bias, masks, and the online softmax of rows ra and rb over this tile, in fp32.
    float max_a = -INFINITY, max_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = n * 8 + 2 * t + (u & 1);  // key offset in the tile
        const bool row_b = u >= 2;
        const int r = row_b ? rb : ra;
        const int64_t key = j0 + c;
        float v = x[n][u] * p.scale;
        if (!(row_b ? real_b : real_a))
          v = 0.0f;  // a row past the sequence: finite, never written out
        else if (key >= (row_b ? visible_b : visible_a))
          v = -INFINITY;
        else if (p.bias == AttnBias::kT5Relative)
          v += rel_s[c - r + kRows - 1];
        else if (p.bias == AttnBias::kAlibi)
          v += slope * static_cast<float>(key);
        x[n][u] = v;
        if (row_b)
          max_b = fmaxf(max_b, v);
        else
          max_a = fmaxf(max_a, v);
      }
      // The quad's four lanes hold a row's 64 keys between them.
#pragma unroll
    for (int off = 1; off <= 2; off *= 2) {
      max_a = fmaxf(max_a, __shfl_xor_sync(0xffffffffu, max_a, off));
      max_b = fmaxf(max_b, __shfl_xor_sync(0xffffffffu, max_b, off));
    }
    // A real row sees key 0 in the first tile, so its running max is finite from then on.
    const float new_a = fmaxf(m_a, max_a), new_b = fmaxf(m_b, max_b);
    const float corr_a = expf(m_a - new_a), corr_b = expf(m_b - new_b);  // 0 for the first tile
    m_a = new_a;
    m_b = new_b;
    // P (rounded to the activation type, as HF's eager attention rounds its probabilities) as
    // the A fragments of P · V: keys 16kk .. 16kk + 15 are key groups 2kk and 2kk + 1.
    uint32_t pf[kKeys / 16][4];
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      const float e0 = expf(x[n][0] - new_a), e1 = expf(x[n][1] - new_a);
      const float e2 = expf(x[n][2] - new_b), e3 = expf(x[n][3] - new_b);
      sum_a += e0 + e1;
      sum_b += e2 + e3;
      pf[n / 2][(n % 2) * 2] = pack2<T>(e0, e1);
      pf[n / 2][(n % 2) * 2 + 1] = pack2<T>(e2, e3);
    }
#pragma unroll
    for (int off = 1; off <= 2; off *= 2) {
      sum_a += __shfl_xor_sync(0xffffffffu, sum_a, off);
      sum_b += __shfl_xor_sync(0xffffffffu, sum_b, off);
    }
    l_a = l_a * corr_a + sum_a;
    l_b = l_b * corr_b + sum_b;
    // O (16 rows x DH) = O * correction + P · V.
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
      o[n][0] *= corr_a;
      o[n][1] *= corr_a;
      o[n][2] *= corr_b;
      o[n][3] *= corr_b;
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        uint32_t b0, b1;
        load_v_fragment(v_s + (kk * 16 + (lane & 15)) * ldt + n * 8, b0, b1);
        mma16816<T>(o[n], pf[kk], b0, b1);
      }
    }
    __syncthreads();  // k_s, v_s and rel_s are rewritten by the next tile
  }

  const float inv_a = 1.0f / l_a, inv_b = 1.0f / l_b;
  T* ya = static_cast<T*>(p.y) + (begin + i0 + ra) * static_cast<int64_t>(p.heads) * DH + head_off +
          2 * t;
  T* yb = ya + 8 * static_cast<int64_t>(p.heads) * DH;
#pragma unroll
  for (int n = 0; n < DH / 8; ++n) {
    if (real_a)
      *reinterpret_cast<uint32_t*>(ya + n * 8) = pack2<T>(o[n][0] * inv_a, o[n][1] * inv_a);
    if (real_b)
      *reinterpret_cast<uint32_t*>(yb + n * 8) = pack2<T>(o[n][2] * inv_b, o[n][3] * inv_b);
  }
}

template <typename T, int DH, int kRows>
void launch_dh(const AttentionParams& p, KernelStream stream) {
  // Every sequence gets as many blocks as the longest one needs (the others' extra blocks
  // return at once).
  const int seq_tiles = static_cast<int>((p.longest_seq + kRows - 1) / kRows);
  const int64_t blocks = static_cast<int64_t>(p.step.num_seqs) * seq_tiles;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.heads));
  if (p.kind == AttnKind::kCachedSelf && p.kv.fp8)
    launch(tiled_attention_kernel<T, DH, kRows, true>, grid, kRows * 2, 0, stream, p, seq_tiles);
  else
    launch(tiled_attention_kernel<T, DH, kRows>, grid, kRows * 2, 0, stream, p, seq_tiles);
}

}  // namespace

bool tiled_attention_applies(const AttentionParams& p) {
  if (p.tiled == TiledAttention::kOff || p.act == FloatType::kF32 || p.kind == AttnKind::kCross)
    return false;
  if (p.head_dim != 64 && p.head_dim != 128) return false;
  if (p.tiled == TiledAttention::kAuto &&
      (p.tokens < kMinRowsPerSeq * p.step.num_seqs || p.tokens / 64 * p.heads < kMinBlocks))
    return false;
  // 16-byte loads of every row's head slice: rows and buffers in whole chunks of 8 elements.
  if (p.q_stride % 8 != 0 || p.kv_stride % 8 != 0 || !aligned16(p.q) || !aligned16(p.k) ||
      !aligned16(p.v))
    return false;
  return p.kind != AttnKind::kCachedSelf || p.kv.row_width % 8 == 0;
}

template <typename T>
void launch_tiled_attention(const AttentionParams& p, KernelStream stream) {
  if (p.tiled_rows == 32)
    p.head_dim == 64 ? launch_dh<T, 64, 32>(p, stream) : launch_dh<T, 128, 32>(p, stream);
  else
    p.head_dim == 64 ? launch_dh<T, 64, 64>(p, stream) : launch_dh<T, 128, 64>(p, stream);
}
template void launch_tiled_attention<__half>(const AttentionParams&, KernelStream);
template void launch_tiled_attention<__nv_bfloat16>(const AttentionParams&, KernelStream);

}  // namespace kiln::cuda
