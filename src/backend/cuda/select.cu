// Token selection where the logits live: the greedy argmax, and the k best tokens of each row
// with the row's log-normaliser (sampling with top-k, beam search). Only token ids and a few
// scores cross to the host. Both order candidates by a 64-bit key: the value's bits made
// order-preserving, then the lower column, so the first maximum wins as in a sequential scan
// (and as std::stable_sort orders equal values).
#include "backend/cuda/device_types.cuh"

namespace kiln::cuda {
namespace {

// Rows are cut into chunks of this many columns, one block each: one block per row would read a
// 250880-entry row at one SM's speed.
constexpr int kChunk = 4096;
constexpr int kSelectThreads = 256;
static_assert(kChunk % kSelectThreads == 0, "a chunk is whole rounds of the block");

__device__ __forceinline__ unsigned long long order_key(float v, long long column) {
  if (v == 0.0f) v = 0.0f;  // -0 == +0: equal values tie on the column
  unsigned int u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // order-preserving for every non-NaN float
  return (static_cast<unsigned long long>(u) << 32) |
         (0xFFFFFFFFull - static_cast<unsigned long long>(column));
}
// Key 0 is never a real key (its upper half would be a NaN's): it marks "none" and "taken".
__device__ __forceinline__ float key_value(unsigned long long key) {
  unsigned int u = static_cast<unsigned int>(key >> 32);
  u = (u & 0x80000000u) ? (u & 0x7FFFFFFFu) : ~u;
  return __uint_as_float(u);
}
__device__ __forceinline__ long long key_column(unsigned long long key) {
  return static_cast<long long>(0xFFFFFFFFull - (key & 0xFFFFFFFFull));
}

__device__ __forceinline__ bool is_banned(const BannedIds& banned, int bans, long long c) {
  bool skip = false;
  for (int b = 0; b < bans; ++b) skip |= banned.id[b] == c;
  return skip;
}

__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long k) {
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, k, o);
    k = other > k ? other : k;
  }
  return k;
}

// The largest key of the block; every thread gets it. Two barriers, so that it can run in a loop.
__device__ __forceinline__ unsigned long long block_max_key(unsigned long long k) {
  __shared__ unsigned long long partial[32];
  k = warp_max_key(k);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = k;
  __syncthreads();
  unsigned long long best = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w)
    best = partial[w] > best ? partial[w] : best;
  __syncthreads();
  return best;
}

// Whether row r bans the BannedIds: its flag byte (ban_row, device memory) or, for up to
// RowMask::kRows rows, its bit of the mask passed by value (no copy of flags before the kernel).
__device__ __forceinline__ bool row_bans(const unsigned char* ban_row, const RowMask& mask,
                                         int64_t r) {
  if (ban_row != nullptr) return ban_row[r] != 0;
  return r < RowMask::kRows && ((mask.bits[r >> 6] >> (r & 63)) & 1ull) != 0;
}

// The greedy argmax's chunks: each thread loads kArgmaxLoads 16-byte vectors of the row (4 f32
// or 8 f16/bf16 logits each), all issued before the first is used; a chunk is 8192 f32 columns.
// (With 4096-column chunks of one scalar load per thread and value, bloom-560m's batch-16 argmax
// over 16 rows of 250880 f32 logits took 16.8 us in ncu, ~1 TB/s: 992 blocks in two waves.)
constexpr int kArgmaxLoads = 8;
template <typename T>
constexpr int64_t kArgmaxChunk = int64_t{kVec<T>} * kArgmaxLoads* kSelectThreads;

// Block (c, r): the largest key of chunk c of row r into keys[r * chunks + c] (0: none); the
// row's last block to finish (row_done[r] counts them, and that block puts it back to zero for
// the next launch) reduces the row's keys to a column (-1: every column banned) into out[r] and,
// when not null, host_out[r] (pinned host memory: the ids reach the host without a copy after
// the kernel). One kernel: a second one for the reduction waited for this one's end (~2 µs on
// the H200 between two decode steps), and no memset before it. kVectors: rows start 16-byte
// aligned (x aligned, cols * sizeof(T) a multiple of 16: rows of whole vectors), so the values
// come in 16-byte loads; otherwise one by one.
template <typename T, bool kVectors>
__global__ void argmax_kernel(const T* x, int64_t cols, BannedIds banned,
                              const unsigned char* ban_row, RowMask mask, unsigned long long* keys,
                              unsigned int* row_done, long long* out, long long* host_out) {
  constexpr int kN = kVec<T>;
  pdl_begin();
  const int64_t r = blockIdx.y;
  const T* row = x + r * cols;
  const int bans = row_bans(ban_row, mask, r) ? banned.count : 0;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kArgmaxChunk<T>;
  const int64_t end = min(cols, begin + kArgmaxChunk<T>);
  // Vector i of the thread covers columns first(i) .. first(i) + kN - 1.
  auto first = [&](int i) {
    return begin + (static_cast<int64_t>(i) * kSelectThreads + threadIdx.x) * kN;
  };
  unsigned long long best = 0;
  auto take = [&](float v, int64_t c) {
    if (c >= end || is_banned(banned, bans, c)) return;
    const unsigned long long key = order_key(v, c);
    best = key > best ? key : best;
  };
  if constexpr (kVectors) {
    uint4 raw[kArgmaxLoads];
#pragma unroll
    for (int i = 0; i < kArgmaxLoads; ++i) {
      const int64_t c0 = first(i);
      // Rows of whole vectors: a vector is in the chunk or past its end.
      raw[i] = c0 < end ? __ldg(reinterpret_cast<const uint4*>(row + c0)) : uint4{};
    }
#pragma unroll
    for (int i = 0; i < kArgmaxLoads; ++i) {
      const T* e = reinterpret_cast<const T*>(&raw[i]);
#pragma unroll
      for (int k = 0; k < kN; ++k) take(to_float(e[k]), first(i) + k);
    }
  } else {
    // Unaligned rows (a rare vocabulary size): value by value, a vector's values at a time.
#pragma unroll 1
    for (int i = 0; i < kArgmaxLoads; ++i) {
      const int64_t c0 = first(i);
      float v[kN];
#pragma unroll
      for (int k = 0; k < kN; ++k) v[k] = c0 + k < end ? to_float(row[c0 + k]) : 0.0f;
#pragma unroll
      for (int k = 0; k < kN; ++k) take(v[k], c0 + k);
    }
  }
  best = block_max_key(best);
  unsigned long long* row_keys = keys + r * gridDim.x;
  __shared__ bool last;
  if (threadIdx.x == 0) {
    row_keys[blockIdx.x] = best;
    __threadfence();  // the key is visible before the count that announces it
    last = atomicAdd(row_done + r, 1u) == gridDim.x - 1;
    __threadfence();  // and the other blocks' keys are read after the count that announced them
  }
  __syncthreads();
  if (!last) return;
  // Every other block of the row has written its key (read from L2: this SM's L1 holds none).
  best = 0;
  for (unsigned int c = threadIdx.x; c < gridDim.x; c += blockDim.x) {
    const unsigned long long k = __ldcg(row_keys + c);
    best = k > best ? k : best;
  }
  best = block_max_key(best);
  if (threadIdx.x != 0) return;
  row_done[r] = 0;
  const long long id = best == 0 ? -1 : key_column(best);
  out[r] = id;
  if (host_out != nullptr) host_out[r] = id;
}

// Top-k, phase 1: block (c, r) selects the k best keys of chunk c of row r (values divided by the
// row's temperature, banned columns skipped) into cand[r][c][0..k), best first, and the chunk's
// max and sum of exp(x - max) over the unscaled values of every column into stats[r][c].
// Selection is k rounds of a block-wide max; only the thread that owned the winner rescans.
template <typename T>
__global__ void topk_chunk_kernel(const T* x, int64_t cols, int k, const float* temperature,
                                  BannedIds banned, const unsigned char* ban_row,
                                  unsigned long long* cand, float2* stats) {
  pdl_begin();
  __shared__ unsigned long long keys[kChunk];
  const int64_t r = blockIdx.y;
  const int chunks = gridDim.x;
  const T* row = x + r * cols;
  const int bans = ban_row != nullptr && ban_row[r] != 0 ? banned.count : 0;
  const float t = temperature != nullptr ? temperature[r] : 1.0f;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int n = static_cast<int>(min(cols - begin, static_cast<int64_t>(kChunk)));
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_float(row[begin + i]);
    mx = fmaxf(mx, v);
    keys[i] = is_banned(banned, bans, begin + i) ? 0ull : order_key(v / t, begin + i);
  }
  mx = block_max(mx);
  float sum = 0.0f;
  if (mx > -INFINITY)
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += expf(to_float(row[begin + i]) - mx);
  sum = block_sum(sum);
  if (threadIdx.x == 0) stats[r * chunks + blockIdx.x] = make_float2(mx, sum);
  unsigned long long* out = cand + (r * chunks + blockIdx.x) * static_cast<int64_t>(k);
  unsigned long long mine = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) mine = keys[i] > mine ? keys[i] : mine;
  for (int j = 0; j < k; ++j) {
    const unsigned long long best = block_max_key(mine);
    if (threadIdx.x == 0) out[j] = best;
    if (best == 0) continue;  // the chunk ran out: the rest stay "none"
    if (mine == best) {       // keys are unique: this thread held the winner
      keys[key_column(best) - begin] = 0;
      mine = 0;
      for (int i = threadIdx.x; i < n; i += blockDim.x) mine = keys[i] > mine ? keys[i] : mine;
    }
  }
}

// Phase 2: block r merges the chunks' candidates (in global memory, taken ones zeroed) into the
// row's k best, and the chunks' stats into the row's log-normaliser.
__global__ void topk_merge_kernel(int chunks, int k, unsigned long long* cand, const float2* stats,
                                  float* values, int* columns, float* log_norm) {
  pdl_begin();
  const int64_t r = blockIdx.x;
  const int m = chunks * k;
  unsigned long long* c = cand + r * static_cast<int64_t>(m);
  unsigned long long mine = 0;
  int at = -1;
  auto rescan = [&] {
    mine = 0;
    for (int i = threadIdx.x; i < m; i += blockDim.x)
      if (c[i] > mine) {
        mine = c[i];
        at = i;
      }
  };
  rescan();
  for (int j = 0; j < k; ++j) {
    const unsigned long long best = block_max_key(mine);
    if (threadIdx.x == 0) {
      values[r * k + j] = best == 0 ? -INFINITY : key_value(best);
      columns[r * k + j] = best == 0 ? -1 : static_cast<int>(key_column(best));
    }
    if (best != 0 && mine == best) {
      c[at] = 0;
      rescan();
    }
  }
  if (threadIdx.x == 0) {
    const float2* s = stats + r * chunks;
    float mx = -INFINITY;
    for (int i = 0; i < chunks; ++i) mx = fmaxf(mx, s[i].x);
    float sum = 0.0f;
    if (mx > -INFINITY)
      for (int i = 0; i < chunks; ++i) sum += s[i].y * expf(s[i].x - mx);
    log_norm[r] = mx + logf(sum);
  }
}

// The chunks of a row of `cols` columns (the argmax's: chunk = kArgmaxChunk<T>).
int chunks_of(int64_t cols, int64_t chunk = kChunk) {
  return static_cast<int>((cols + chunk - 1) / chunk);
}

}  // namespace

size_t argmax_scratch_bytes(int64_t rows, int64_t cols) {
  // f32's chunks are the smallest, so its count is the most of any type.
  return static_cast<size_t>(rows) * static_cast<size_t>(chunks_of(cols, kArgmaxChunk<float>)) *
         sizeof(unsigned long long);
}

void launch_argmax_rows(FloatType t, const void* x, int64_t rows, int64_t cols,
                        const BannedIds& banned, const unsigned char* ban_row, const RowMask& mask,
                        void* scratch, unsigned int* row_done, long long* out, long long* host_out,
                        KernelStream stream) {
  if (rows == 0) return;
  auto* keys = static_cast<unsigned long long*>(scratch);
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    const dim3 grid(static_cast<unsigned>(chunks_of(cols, kArgmaxChunk<T>)),
                    static_cast<unsigned>(rows));
    const bool vectors = aligned16(x) && (cols * static_cast<int64_t>(sizeof(T))) % 16 == 0;
    launch(vectors ? argmax_kernel<T, true> : argmax_kernel<T, false>, grid, kSelectThreads, 0,
           stream, static_cast<const T*>(x), cols, banned, ban_row, mask, keys, row_done, out,
           host_out);
  });
}

size_t topk_scratch_bytes(int64_t rows, int64_t cols, int k) {
  const auto chunks = static_cast<size_t>(chunks_of(cols));
  return static_cast<size_t>(rows) * chunks *
         (static_cast<size_t>(k) * sizeof(unsigned long long) + sizeof(float2));
}

void launch_topk_rows(FloatType t, const void* x, int64_t rows, int64_t cols, int k,
                      const float* temperature, const BannedIds& banned,
                      const unsigned char* ban_row, void* scratch, float* values, int* columns,
                      float* log_norm, KernelStream stream) {
  if (rows == 0 || k <= 0) return;
  const int chunks = chunks_of(cols);
  auto* cand = static_cast<unsigned long long*>(scratch);
  auto* stats = reinterpret_cast<float2*>(cand + rows * chunks * static_cast<int64_t>(k));
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(rows));
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch(topk_chunk_kernel<T>, grid, kSelectThreads, 0, stream, static_cast<const T*>(x), cols, k,
           temperature, banned, ban_row, cand, stats);
  });
  launch(topk_merge_kernel, static_cast<unsigned>(rows), kSelectThreads, 0, stream, chunks, k, cand,
         stats, values, columns, log_norm);
}

}  // namespace kiln::cuda
