// The Linear of batched decode steps on tensor cores: y [rows, out] = x [rows, in] · w [out, in]^T
// for up to kSkinnyMaxRows rows (untuned plans: 9-32), fp16 or bf16 with fp32 accumulation
// (mma.sync m16n8k16). At 16 rows such a product still reads each weight once and does little with
// it, so, as for the GEMV, its time is the time the weights take to stream from HBM, and the time
// the chain of kernels waits for them: cuBLASLt's kernels (5-6 us for bloom-560m's 2-8 MB matrices
// at 16 rows) launch without programmatic dependent launch and start loading only when the
// kernel before them has ended. Here every warp loads its first weights before its
// programmatic-launch wait, as the GEMV does.
//
// A block takes a tile of 8 NT features (weight rows) and all rows (MT tiles of 16); its 8 or 16
// warps share the tile's reduction: warp v takes k-steps v, v + warps, ... of 32 elements. In a
// k-step lane l loads the 16 bytes of weight row 8 n + l / 4 at elements 8 (l % 4) .. +7 and the
// same 16 bytes of x rows l / 4 and l / 4 + 8: with the k order permuted alike in A and B
// (elements 0-3 of each lane's eight for the first m16n8k16, 4-7 for the second), every operand
// of the mma fragments comes from one 16-byte load, with no shuffles and no shared memory. The
// warps' partial tiles meet in shared memory, added in warp order (a row's result does not
// depend on the other rows or on their number); bias, activation and a fused residual ride on
// the store, rounded as the GEMV rounds them (a folded input norm runs as the norm kernel
// before it: taken inside, from each row's statistics gathered first, it made bloom-560m's
// batch-16 step 0.86 -> 0.92 ms). Grids larger than the SMs hold (the
// lm_head's 250880 features) loop over tiles, each block loading its next tile's first weights
// before the reduction of the current one; x's rows, read again for each tile, stay in L1.
// At 64 rows a block per tile reads all of x per tile, 3-8 times the weights' bytes from L2:
// slower than cuBLASLt (bloom-560m's batch-64 step 1.38 -> 1.82 ms), hence kSkinnyMaxRows.
// int8-weight plans' Linears (SkinnyParams::scales) load 8 bytes of int8 weights where fp16 loads
// 16 and widen them to the same registers exactly (widen_i8), the scale applied at the store;
// int4-weight plans' (SkinnyParams::group_scales) load 4 bytes of int4 weights and widen them
// times their group's scale (a k-step lies in one group of 128), each weight rounded to T once.
#include "backend/cuda/device_types.cuh"

namespace kiln::cuda {
namespace {

// k-steps (32 elements) a warp loads per pass: kSteps NT weight loads in flight a lane (eight
// with one feature tile).
template <int NT>
constexpr int kSteps = NT == 1 ? 8 : 4;
// A block's warps split its tile's k-steps: 8, or 16 where 8 would each take more than one pass
// (bloom-560m's dense_4h_to_h, 4096 inputs, at 16 rows: 128 blocks; with 8 warps the second
// pass's loads left after the first's products, and it held the chain 7.8 us for its 8 MB).
// Launch bounds: 512 threads an SM (two blocks of 8 warps, one of 16), up to 128 registers.
constexpr int kThreadsPerSm = 512;

// The weights' format: the activations' type, int8 with per-channel scales, int4 with group
// scales.
enum class WFormat : uint8_t { kFloat, kI8, kI4 };
// A lane's weights of one k-step: 16 bytes of 8 halves, (int8-weight plans) 8 bytes of 8 int8
// values, which become the same four registers of T pairs in registers, exactly (q in [-127,
// 127]; the per-channel scale multiplies the sum at the store), or (int4-weight plans) 4 bytes
// of 8 int4 values, widened times their group's scale.
template <WFormat F>
using WeightVec = std::conditional_t<F == WFormat::kI8, uint2,
                                     std::conditional_t<F == WFormat::kI4, unsigned, uint4>>;

// 8 int4 weights (element 2j in byte j's low nibble) times s as four T pairs (elements 0-1, 2-3,
// 4-5, 6-7), each product rounded to T once.
template <typename T>
__device__ __forceinline__ uint4 widen_i4(unsigned w, __half s) {
  const unsigned t = w ^ 0x88888888u;  // nibbles as q + 8
  const unsigned even = t & 0x0F0F0F0Fu, odd = (t >> 4) & 0x0F0F0F0Fu;
  unsigned out[4];
  if constexpr (std::is_same_v<T, __half>) {
    // 0x64XX is the half 1024 + XX: subtract 1032 = 1024 + 8, then scale.
    const __half2 bias = __halves2half2(__ushort_as_half(0x6408), __ushort_as_half(0x6408));
    const __half2 s2 = __halves2half2(s, s);
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const unsigned sel = static_cast<unsigned>(b) | ((4u + b) << 8);  // even b, _, odd b, _
      const unsigned v = (__byte_perm(even, odd, sel) & 0x00FF00FFu) | 0x64006400u;
      const __half2 h = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&v), bias), s2);
      out[b] = *reinterpret_cast<const unsigned*>(&h);
    }
  } else {
    // 0x4B0000XX is the float 2^23 + XX.
    const float sf = __half2float(s);
    auto value = [](unsigned word, unsigned b) {
      return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7440u | b)) - 8388616.0f;
    };
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(value(even, b) * sf, value(odd, b) * sf);
      out[b] = *reinterpret_cast<const unsigned*>(&h);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

template <typename T>
__device__ __forceinline__ uint4 widen_i8(const uint2& w) {
  const unsigned lo = w.x ^ 0x80808080u, hi = w.y ^ 0x80808080u;  // bytes as q + 128
  uint4 r;
  if constexpr (std::is_same_v<T, __half>) {
    // 0x64XX is the half 1024 + XX: subtract 1152 = 1024 + 128.
    const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
    auto pair = [&](unsigned word, unsigned sel) {
      const unsigned v = __byte_perm(word, 0x64646464u, sel);
      const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&v), bias);
      return *reinterpret_cast<const unsigned*>(&h);
    };
    r.x = pair(lo, 0x5140u);
    r.y = pair(lo, 0x5342u);
    r.z = pair(hi, 0x5140u);
    r.w = pair(hi, 0x5342u);
  } else {
    // 0x4B0000XX is the float 2^23 + XX; bf16 holds the integers exactly.
    auto value = [](unsigned word, unsigned b) {
      return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7440u | b)) - 8388736.0f;
    };
    auto pair = [&](unsigned word, unsigned b) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(value(word, b), value(word, b + 1));
      return *reinterpret_cast<const unsigned*>(&h);
    };
    r.x = pair(lo, 0);
    r.y = pair(lo, 2);
    r.z = pair(hi, 0);
    r.w = pair(hi, 2);
  }
  return r;
}

// MT tiles of 16 rows, NT tiles of 8 features, kWarps warps. x_rows.index not null: row r is x's
// row x_rows.index[r] (the lm_head of a decode step). kI8: int8 weights, each feature's sum
// times scales[f] before the bias; kI4: int4 weights, group_scales f16 [out, in / 128].
template <typename T, int MT, int NT, int kWarps, WFormat kFormat = WFormat::kFloat>
__global__ void __launch_bounds__(kWarps * 32, kThreadsPerSm / (kWarps * 32))
    skinny_kernel(const uint4* __restrict__ x, const WeightVec<kFormat>* __restrict__ w,
                  const float* __restrict__ scales, const __half* __restrict__ group_scales,
                  const T* __restrict__ bias, const T* residual, T* y, float* y32, int rows,
                  int64_t ksteps, int64_t out, int64_t tiles, bool has_act, ActFn act,
                  RowIndex x_rows) {
  constexpr bool kI8 = kFormat == WFormat::kI8, kI4 = kFormat == WFormat::kI4;
  const int64_t groups = (ksteps + 3) / 4;  // int4: scales a row (a group is 4 k-steps)
  constexpr int F = NT * 8, R = MT * 16;
  constexpr int kThreads = kWarps * 32;
  constexpr int kPer = (R * F + kThreads - 1) / kThreads;  // outputs a thread stores per tile
  __shared__ float red[kWarps][R][F + 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t chunks = ksteps * 4;  // 16-byte chunks of a row
  const int64_t my_steps = ksteps > warp ? (ksteps - warp + kWarps - 1) / kWarps : 0;
  const int64_t passes = (my_steps + kSteps<NT> - 1) / kSteps<NT>;
  WeightVec<kFormat> wv[kSteps<NT>][NT];
  __half gs[kI4 ? kSteps<NT> : 1][NT];  // int4: each loaded k-step's group scale
  // The weights of a pass; features past `out` (the last tile) read row out - 1 and are never
  // stored, k-steps past the warp's last load nothing.
  auto load_weights = [&](int64_t tile, int64_t pass) {
#pragma unroll
    for (int u = 0; u < kSteps<NT>; ++u) {
      const int64_t s = pass * kSteps<NT> + u;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int64_t f = min(tile * F + n * 8 + g, out - 1);
        const int64_t step = warp + s * kWarps;
        wv[u][n] = s < my_steps ? __ldcs(w + f * chunks + step * 4 + q) : WeightVec<kFormat>{};
        if constexpr (kI4) gs[u][n] = s < my_steps ? group_scales[f * groups + step / 4] : __half{};
      }
    }
  };
  int64_t tile = blockIdx.x;
  // Weights are constant: the first pass streams while the kernel before this one finishes.
  load_weights(tile, 0);
  pdl_wait();
  pdl_trigger();
  // Row r of the product (null: past `rows`, or a bad gathered row, reported once: that step's
  // results are not used).
  auto row_of = [&](int r, bool reporter) -> const uint4* {
    long long row = r < rows ? r : -1;
    if (row >= 0 && x_rows.index != nullptr)
      row = gathered_row(x_rows, r, kStatusGatherRow, reporter);
    return row >= 0 ? x + row * chunks : nullptr;
  };
  // This lane's x rows: g + 16 m and g + 8 + 16 m.
  const uint4* xr[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      xr[m][h] = row_of(m * 16 + h * 8 + g, blockIdx.x == 0 && warp == 0 && q == 0);
  for (; tile < tiles; tile += gridDim.x) {
    // The store's bias (constant) and residual (written before this kernel), in flight during
    // the products.
    float bias_v[kPer], res_v[kPer], scale_v[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int idx = threadIdx.x + i * kThreads, r = idx / F;
      const int64_t f = tile * F + idx % F;
      const bool stores = idx < R * F && r < rows && f < out;
      bias_v[i] = stores && bias != nullptr ? to_float(bias[f]) : 0.0f;
      scale_v[i] = kI8 && stores ? scales[f] : 1.0f;
      res_v[i] = stores && residual != nullptr ? to_float(residual[r * out + f]) : 0.0f;
    }
    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.0f;
    for (int64_t pass = 0; pass < passes; ++pass) {
      if (pass > 0) load_weights(tile, pass);
#pragma unroll
      for (int u = 0; u < kSteps<NT>; ++u) {
        const int64_t s = pass * kSteps<NT> + u;
        if (s >= my_steps) break;
        const int64_t at = (warp + s * kWarps) * 4 + q;
        uint4 xa[MT][2];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            xa[m][h] = xr[m][h] != nullptr ? __ldg(xr[m][h] + at) : uint4{};
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          // Elements 0-3 of the lane's eight: the first product's k columns 2q, 2q + 1 (A's and
          // B's first registers) and 2q + 8, 2q + 9 (their second); 4-7 the second product's.
          const uint32_t a_lo[4] = {xa[m][0].x, xa[m][1].x, xa[m][0].y, xa[m][1].y};
          const uint32_t a_hi[4] = {xa[m][0].z, xa[m][1].z, xa[m][0].w, xa[m][1].w};
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            uint4 b;
            if constexpr (kI8)
              b = widen_i8<T>(wv[u][n]);
            else if constexpr (kI4)
              b = widen_i4<T>(wv[u][n], gs[u][n]);
            else
              b = wv[u][n];
            mma16816<T>(acc[m][n], a_lo, b.x, b.y);
            mma16816<T>(acc[m][n], a_hi, b.z, b.w);
          }
        }
      }
    }
    const int64_t next = tile + gridDim.x;
    if (next < tiles) {
      load_weights(next, 0);
    }
    // D fragments: lane l holds rows l / 4 and l / 4 + 8 at features 2 (l % 4) and 2 (l % 4) + 1.
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float* lo = &red[warp][m * 16 + g][n * 8 + 2 * q];
        float* hi = &red[warp][m * 16 + g + 8][n * 8 + 2 * q];
        lo[0] = acc[m][n][0];
        lo[1] = acc[m][n][1];
        hi[0] = acc[m][n][2];
        hi[1] = acc[m][n][3];
      }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int idx = threadIdx.x + i * kThreads, r = idx / F, c = idx % F;
      const int64_t f = tile * F + c;
      if (idx >= R * F || r >= rows || f >= out) continue;
      float v = 0.0f;
#pragma unroll
      for (int p = 0; p < kWarps; ++p) v += red[p][r][c];
      if constexpr (kI8) v *= scale_v[i];
      if (bias != nullptr) v += bias_v[i];
      v = round_as<T>(v);
      if (has_act) v = apply_act(act, v);
      const int64_t at = r * out + f;
      // A fused residual add rounds like the Add it replaces: (residual + round(y)), rounded.
      if (residual != nullptr) v = round_as<T>(v) + res_v[i];
      if (y32 != nullptr)
        y32[at] = round_as<T>(v);  // a widened output: the same value, stored as f32
      else
        y[at] = from_float<T>(v);
    }
    __syncthreads();
  }
}

// The widest feature tile (of NT x 8 features) that still gives every SM a block (4 at most;
// at two row tiles, two: with four the registers spilled 2 KB): fewer tiles read x fewer times
// from L2.
int feature_tiles(int64_t rows, int64_t out, int sms) {
  for (int c : {4, 2}) {
    if (rows > 16 && c == 4) continue;
    if ((out + 8 * c - 1) / (8 * c) >= sms) return c;
  }
  return 1;
}

template <typename T, int MT, int NT>
void launch_nt(const SkinnyParams& p, KernelStream stream) {
  const int64_t tiles = (p.out + 8 * NT - 1) / (8 * NT), ksteps = p.in / 32;
  const int warps = ksteps > 8 * kSteps<NT> ? 16 : 8;
  // At most the blocks the SMs hold at once; larger grids loop over the tiles.
  const int64_t most = static_cast<int64_t>(kThreadsPerSm / (warps * 32)) * p.sms;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(tiles, most));
  auto go = [&](auto kernel, auto w) {
    launch(kernel, blocks, warps * 32, 0, stream, static_cast<const uint4*>(p.x), w, p.scales,
           static_cast<const __half*>(p.group_scales), static_cast<const T*>(p.bias),
           static_cast<const T*>(p.residual), static_cast<T*>(p.y), p.y32, static_cast<int>(p.rows),
           ksteps, p.out, tiles, p.has_act, p.act, p.x_rows);
  };
  if (p.group_scales != nullptr) {
    const auto* w = static_cast<const unsigned*>(p.w);
    if (warps == 16) return go(skinny_kernel<T, MT, NT, 16, WFormat::kI4>, w);
    return go(skinny_kernel<T, MT, NT, 8, WFormat::kI4>, w);
  }
  if (p.scales != nullptr) {
    const auto* w = static_cast<const uint2*>(p.w);
    if (warps == 16) return go(skinny_kernel<T, MT, NT, 16, WFormat::kI8>, w);
    return go(skinny_kernel<T, MT, NT, 8, WFormat::kI8>, w);
  }
  const auto* w = static_cast<const uint4*>(p.w);
  if (warps == 16) return go(skinny_kernel<T, MT, NT, 16>, w);
  go(skinny_kernel<T, MT, NT, 8>, w);
}

template <typename T, int MT>
void launch_mt(const SkinnyParams& p, KernelStream stream) {
  const int nt = feature_tiles(p.rows, p.out, p.sms);
  if constexpr (MT == 1)
    if (nt == 4) return launch_nt<T, MT, 4>(p, stream);
  if (nt == 2) return launch_nt<T, MT, 2>(p, stream);
  launch_nt<T, MT, 1>(p, stream);
}

template <typename T>
void launch_t(const SkinnyParams& p, KernelStream stream) {
  if (p.rows <= 16) return launch_mt<T, 1>(p, stream);
  launch_mt<T, 2>(p, stream);
}

}  // namespace

bool skinny_fits(FloatType t, const void* x, const void* w, int64_t in, int64_t rows, bool i8,
                 bool i4) {
  const uintptr_t mask = i4 ? 3 : i8 ? 7 : 15;
  return t != FloatType::kF32 && rows > 0 && rows <= kSkinnyMaxRows && in > 0 && in % 32 == 0 &&
         aligned16(x) && (reinterpret_cast<uintptr_t>(w) & mask) == 0;
}

void launch_skinny(const SkinnyParams& p, KernelStream stream) {
  if (p.rows <= 0 || p.out <= 0) return;
  if (p.type == FloatType::kF16)
    launch_t<__half>(p, stream);
  else
    launch_t<__nv_bfloat16>(p, stream);
}

}  // namespace kiln::cuda
