// Attention over prompts on tensor cores (fp16/bf16, head_dim 64 or 128): a block per (64 or 32
// query rows of one sequence, head), a warp per 16 rows, keys in tiles of 64 through shared
// memory. Per tile, S = Q·Kᵀ on tensor cores (fp32 accumulation); then, per row in fp32, the
// scale, the position bias (T5's buckets, ALiBi), the causal and length masks and an online
// softmax (running max and sum, as flash attention does); then O += P·V on tensor cores, with P
// rounded to the activation type as HuggingFace's eager attention rounds its probabilities before
// they multiply the values. No score matrix beyond a tile; each key row is read once per 32 or 64
// queries instead of once per query as the row kernel (attention.cu) reads it. Cached self
// attention also stores its rows' K/V of the head in the paged cache.
#include <mma.h>

#include "backend/cuda/attention_common.cuh"

namespace kiln::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using attn::alibi_slope;
using attn::cache_row;
using attn::key_row;
using attn::KeyRow;
using attn::position_bias;

constexpr int kKeys = 64;  // keys per tile
// A step takes the tiled kernel when its sequences average at least this many rows (prompts);
// decode steps (a row or a few per sequence) keep the row kernel.
constexpr int64_t kMinRowsPerSeq = 16;
// ... and fill the GPU: at least this many (query tile, head) blocks (a batch-1 prompt of 78
// tokens, 32 blocks, runs faster on the row kernel's 1248).
constexpr int64_t kMinBlocks = 256;

// Shared memory of a block, in bytes from its start. Row pitches are padded (8 elements of T,
// 4 floats) against bank conflicts; every fragment's first element stays 32-byte aligned, as
// wmma's loads and stores require.
template <int DH, int kRows>
struct Smem {
  static constexpr int ldt = DH + 8;     // T per row of Q, K, V
  static constexpr int lds = kKeys + 4;  // floats per score row
  static constexpr int ldp = kKeys + 8;  // T per probability row
  static constexpr int ldo = DH + 4;     // floats per output row
  static constexpr size_t q = 0;
  static constexpr size_t k = q + size_t{kRows} * ldt * 2;
  static constexpr size_t v = k + size_t{kKeys} * ldt * 2;
  static constexpr size_t s = v + size_t{kKeys} * ldt * 2;
  static constexpr size_t p = s + size_t{kRows} * lds * 4;
  static constexpr size_t o = p + size_t{kRows} * ldp * 2;
  static constexpr size_t bytes = o + size_t{kRows} * ldo * 4;
  static_assert(k % 32 == 0 && v % 32 == 0 && s % 32 == 0 && p % 32 == 0 && o % 32 == 0);
};

__device__ __forceinline__ uint4 load16(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void store16(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

template <typename T, int DH, int kRows>
__global__ void __launch_bounds__(kRows * 2)
    tiled_attention_kernel(AttentionParams p, int seq_tiles) {
  constexpr int kThreads = kRows * 2;  // a warp per 16 query rows
  using L = Smem<DH, kRows>;
  using Frag16 = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte chunk
  constexpr int kChunks = DH / kPer;                      // chunks per head row
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + L::q);
  T* k_s = reinterpret_cast<T*>(smem + L::k);
  T* v_s = reinterpret_cast<T*>(smem + L::v);
  // T5: the bias of every distance key - query a tile spans (-63 .. 63), per tile.
  __shared__ float rel_s[kRows + kKeys - 1];
  __shared__ int bad_block;
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
  const int rows = static_cast<int>(min(static_cast<int64_t>(kRows), tokens - i0));
  const int64_t past = p.kind == AttnKind::kCachedSelf ? st.past_len[s] : 0;
  const int64_t key_len = past + tokens;
  const int64_t q0 = past + i0;  // position of the block's first query
  const int64_t key_end = p.causal ? min(key_len, q0 + rows) : key_len;
  const int64_t head_off = static_cast<int64_t>(h) * DH;

  if (tid == 0) bad_block = 0;
  for (int c = tid; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, part = c % kChunks;
    uint4 val = make_uint4(0, 0, 0, 0);  // rows past the sequence's end attend to nothing
    if (r < rows)
      val = load16(static_cast<const T*>(p.q) + (begin + i0 + r) * p.q_stride + head_off +
                   part * kPer);
    store16(q_s + r * L::ldt + part * kPer, val);
  }
  if (p.kind == AttnKind::kCachedSelf) {
    // The rows' key and value of head h into the sequence's cache blocks (the KV append: this
    // step's keys are read below from the step's rows, so nothing waits for these stores).
    for (int c = tid; c < rows * kChunks; c += kThreads) {
      const int r = c / kChunks, part = c % kChunks;
      const KeyRow<T> dst = cache_row<T>(p, s, q0 + r);
      if (dst.key == nullptr) continue;  // reported by cache_row: the step fails
      const int64_t src = (begin + i0 + r) * p.kv_stride + head_off + part * kPer;
      store16(const_cast<T*>(dst.key) + head_off + part * kPer,
              load16(static_cast<const T*>(p.k) + src));
      store16(const_cast<T*>(dst.value) + head_off + part * kPer,
              load16(static_cast<const T*>(p.v) + src));
    }
  }
  float* s_w = reinterpret_cast<float*>(smem + L::s) + warp * 16 * L::lds;
  T* p_w = reinterpret_cast<T*>(smem + L::p) + warp * 16 * L::ldp;
  float* o_w = reinterpret_cast<float*>(smem + L::o) + warp * 16 * L::ldo;
  for (int e = lane; e < 16 * L::ldo; e += 32) o_w[e] = 0.0f;
  __syncthreads();  // q_s and bad_block
  Frag16 q_frag[DH / 16];
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk)
    wmma::load_matrix_sync(q_frag[kk], q_s + warp * 16 * L::ldt + kk * 16, L::ldt);
  // The softmax runs a row per lane pair: lane 2rr + half takes row rr of the warp's 16 and
  // the keys half, half + 2, ... of each tile (and, of the output, dimensions half * DH/2 ..).
  const int rr = lane / 2, half = lane % 2;
  const int r = warp * 16 + rr;  // the row in the block
  const bool real = r < rows;
  const int64_t qpos = q0 + r;
  const int64_t visible = p.causal ? min(key_len, qpos + 1) : key_len;
  float m_run = -INFINITY, l_run = 0.0f;
  const float slope = p.bias == AttnBias::kAlibi ? alibi_slope(h, p.heads) : 0.0f;

  for (int64_t j0 = 0; j0 < key_end; j0 += kKeys) {
    // K and V rows j0 .. j0 + 63 of head h (zeros past the keys this block may see).
    for (int c = tid; c < kKeys * kChunks; c += kThreads) {
      const int kr = c / kChunks, part = c % kChunks;
      const int64_t key = j0 + kr;
      uint4 kc = make_uint4(0, 0, 0, 0), vc = kc;
      if (key < key_end) {
        const KeyRow<T> row = key_row<T>(p, s, key);
        if (row.key == nullptr) {
          bad_block = 1;
        } else {
          kc = load16(row.key + head_off + part * kPer);
          vc = load16(row.value + head_off + part * kPer);
        }
      }
      store16(k_s + kr * L::ldt + part * kPer, kc);
      store16(v_s + kr * L::ldt + part * kPer, vc);
    }
    if (p.bias == AttnBias::kT5Relative)
      for (int e = tid; e < kRows + kKeys - 1; e += kThreads)
        rel_s[e] = attn::relative_bias(p, j0 - q0 + e - (kRows - 1), h);
    __syncthreads();
    if (bad_block) return;  // reported by key_row; the step fails

      // S (16 rows x 64 keys of this warp) = Q · Kᵀ.
#pragma unroll
    for (int n = 0; n < kKeys / 16; ++n) {
      Acc acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < DH / 16; ++kk) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, k_s + n * 16 * L::ldt + kk * 16, L::ldt);
        wmma::mma_sync(acc, q_frag[kk], kf, acc);
      }
      wmma::store_matrix_sync(s_w + n * 16, acc, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // Scale, bias, masks, and the online softmax of row rr over this tile, in fp32.
    float x[kKeys / 2];
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) {
      const int c = half + 2 * i;
      const int64_t key = j0 + c;
      float v = s_w[rr * L::lds + c] * p.scale;
      if (!real)
        v = 0.0f;  // a row past the sequence: finite, never written out
      else if (key >= visible)
        v = -INFINITY;
      else if (p.bias == AttnBias::kT5Relative)
        v += rel_s[c - r + kRows - 1];
      else if (p.bias == AttnBias::kAlibi)
        v += slope * static_cast<float>(key);
      x[i] = v;
      tile_max = fmaxf(tile_max, v);
    }
    // A real row sees key 0 in the first tile, so its running max is finite from then on.
    const float m_new = fmaxf(m_run, fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1)));
    const float correction = expf(m_run - m_new);  // 0 for the first tile
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) {
      const float e = expf(x[i] - m_new);
      sum += e;
      p_w[rr * L::ldp + half + 2 * i] = from_float<T>(e);
    }
    l_run = l_run * correction + sum + __shfl_xor_sync(0xffffffffu, sum, 1);
    m_run = m_new;
    if (correction != 1.0f)
#pragma unroll
      for (int d = 0; d < DH / 2; ++d) o_w[rr * L::ldo + half * (DH / 2) + d] *= correction;
    __syncwarp();

    // O (16 rows x DH) += P · V.
#pragma unroll
    for (int n = 0; n < DH / 16; ++n) {
      Acc acc;
      wmma::load_matrix_sync(acc, o_w + n * 16, L::ldo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        Frag16 pf;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
        wmma::load_matrix_sync(pf, p_w + kk * 16, L::ldp);
        wmma::load_matrix_sync(vf, v_s + kk * 16 * L::ldt + n * 16, L::ldt);
        wmma::mma_sync(acc, pf, vf, acc);
      }
      wmma::store_matrix_sync(o_w + n * 16, acc, L::ldo, wmma::mem_row_major);
    }
    __syncthreads();  // k_s, v_s and rel_s are rewritten by the next tile
  }

  if (!real) return;
  const float inv = 1.0f / l_run;
  T* yr = static_cast<T*>(p.y) + (begin + i0 + r) * static_cast<int64_t>(p.heads) * DH + head_off +
          half * (DH / 2);
  const float* orow = o_w + rr * L::ldo + half * (DH / 2);
#pragma unroll
  for (int d = 0; d < DH / 2; d += kPer) {
    uint4 out;
    T* e = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int u = 0; u < kPer; ++u) e[u] = from_float<T>(orow[d + u] * inv);
    store16(yr + d, out);
  }
}

template <typename T, int DH, int kRows>
void launch_dh(const AttentionParams& p, KernelStream stream) {
  // Every sequence gets as many blocks as the longest one needs (the others' extra blocks
  // return at once).
  const int seq_tiles = static_cast<int>((p.longest_seq + kRows - 1) / kRows);
  const int64_t blocks = static_cast<int64_t>(p.step.num_seqs) * seq_tiles;
  launch(tiled_attention_kernel<T, DH, kRows>,
         dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(p.heads)), kRows * 2,
         Smem<DH, kRows>::bytes, stream, p, seq_tiles);
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

cudaError_t prepare_tiled_attention() {
  // Above 48 KB of dynamic shared memory a kernel has to ask for it.
  cudaError_t err = cudaSuccess;
  auto allow = [&](auto kernel, size_t bytes) {
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(bytes));
  };
  allow(tiled_attention_kernel<__half, 64, 64>, Smem<64, 64>::bytes);
  allow(tiled_attention_kernel<__half, 128, 64>, Smem<128, 64>::bytes);
  allow(tiled_attention_kernel<__nv_bfloat16, 64, 64>, Smem<64, 64>::bytes);
  allow(tiled_attention_kernel<__nv_bfloat16, 128, 64>, Smem<128, 64>::bytes);
  allow(tiled_attention_kernel<__half, 64, 32>, Smem<64, 32>::bytes);
  allow(tiled_attention_kernel<__half, 128, 32>, Smem<128, 32>::bytes);
  allow(tiled_attention_kernel<__nv_bfloat16, 64, 32>, Smem<64, 32>::bytes);
  allow(tiled_attention_kernel<__nv_bfloat16, 128, 32>, Smem<128, 32>::bytes);
  return err;
}

}  // namespace kiln::cuda
