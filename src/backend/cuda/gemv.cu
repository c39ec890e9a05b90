// The Linear of decode steps: y [n, out] = x [n, in] · w [out, in]^T for a few rows (n <=
// kGemvMaxRows). Such a product reads every weight once and does little arithmetic with it, so
// its speed is the speed at which the weights stream from HBM: each warp reads four features'
// weight rows with 16-byte loads, eight in flight per lane, and multiplies them into all n rows
// at once (x is small and stays in L1/L2; each x chunk it loads serves the four rows). When
// there are too few features to fill the GPU (out = 1024 on a 132-SM chip), `split` warps share
// a group of features, each over an interleaved part of the rows, and their sums are added in a
// fixed order. Bias, activation and a fused residual ride on the store. A folded input norm
// (fuse_norm_linear: BLOOM's LayerNorms before query_key_value and dense_h_to_4h, and ln_f before
// the tied lm_head, its gamma multiplied into x on the fly; one row, see kNormMaxRows) needs the
// row's sum and sum of squares: the lanes add up the x chunks they multiply anyway, and the
// store applies mean and 1 / std (or 1 / rms) to the product. The wide one-row instance
// (GemvParams::wide) gives each lane sixteen loads and its warps all their weights before the
// wait, in fewer blocks, so that its whole grid fits beside the GEMV before it.
#include "backend/cuda/device_types.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 8;     // per block
constexpr int kFeatures = 4;  // features (weight rows) per warp: each x chunk serves 4 rows
// Chunk positions a lane loads per pass (the kernel's kUnroll): 2 x 4 weight loads in flight.
// The wide one-row instance (GemvParams::wide) takes kWideUnroll and the smallest split that puts
// every weight of its warp in flight before the wait (up to kWarps: rows longer than 1024 chunks
// take more passes).
constexpr int kDefaultUnroll = 2;
constexpr int kWideUnroll = 4;
// A folded input norm runs inside the GEMV at one row only. Summing the rows costs ALU work per
// weight load and registers (162 a thread at 8 rows against 128: half the blocks per SM): on
// the H200 bloom-560m's decode step was 12 % faster at one row, the same at two, and slower
// from three (1.12 against 1.04 ms; 4.18 against 2.12 at eight) than standardizing the rows
// with the norm kernel first.
constexpr int64_t kNormMaxRows = 1;

// 16-byte chunks of a weight row of `in` elements of t (launch_n's in / Vec<T>::kN).
int64_t row_chunks(FloatType t, int64_t in) { return in * (t == FloatType::kF32 ? 4 : 2) / 16; }

// Blocks of kWarps warps for `out` features in groups of kFeatures, `split` warps a group.
int64_t grid_blocks(int64_t out, int split) {
  const int64_t groups = (out + kFeatures - 1) / kFeatures, per_block = kWarps / split;
  return (groups + per_block - 1) / per_block;
}

// The wide instance's split: the smallest whose warps hold all their weights at once
// (kWideUnroll chunk positions of 32 lanes each), at most kWarps.
int wide_split(int64_t chunks) {
  int split = 1;
  while (split < kWarps && static_cast<int64_t>(kWideUnroll) * 32 * split < chunks) split *= 2;
  return split;
}

// The 16 bytes at p as floats (8 halves, 8 bf16 or 4 floats).
template <typename T>
struct Vec {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
};

template <typename T>
__device__ __forceinline__ void unpack(const uint4& raw, float (&out)[Vec<T>::kN]) {
  if constexpr (sizeof(T) == 4) {
    out[0] = __uint_as_float(raw.x);
    out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  } else {
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int u = 0; u < Vec<T>::kN; ++u) out[u] = to_float(e[u]);
  }
}

template <typename T>
__device__ __forceinline__ float dot16(const uint4& w, const uint4& x) {
  float wf[Vec<T>::kN], xf[Vec<T>::kN];
  unpack<T>(w, wf);
  unpack<T>(x, xf);
  float s = 0.0f;
#pragma unroll
  for (int u = 0; u < Vec<T>::kN; ++u) s = fmaf(wf[u], xf[u], s);
  return s;
}

// kNorm: a folded norm (row_sums null: RMSNorm), held to 64 registers (four blocks an SM, as
// without it: at 68 the one-row GEMV lost a quarter of its warps and most of the gain). kScale:
// with its gamma multiplied into x (scale, f32 [in]: the norm of a shared weight, BLOOM's ln_f
// before the tied lm_head), held to three blocks an SM (up to 85 registers; at 64 it spilled 32
// bytes), as many as the plain one-row instance gets with its 72.
// kGather (kNorm, one row): x's row x_rows.index[0] (the lm_head reading the row it needs).
// kUnroll: chunk positions a lane loads per pass (kDefaultUnroll); the wide one-row instance's
// kWideUnroll holds it to two blocks an SM (108 registers, no spills).
template <typename T, typename B, int N, bool kNorm, bool kScale = false, bool kGather = false,
          int kUnroll = kDefaultUnroll>
__global__ void __launch_bounds__(kWarps * 32, kUnroll > kDefaultUnroll ? 2
                                               : kNorm                  ? (kScale ? 3 : 4)
                                                                        : 1)
    gemv_kernel(const uint4* __restrict__ x, const uint4* __restrict__ w,
                const B* __restrict__ bias, const T* residual, T* y, int64_t chunks, int64_t out,
                int split, bool has_act, ActFn act, const float* __restrict__ row_sums, float eps,
                const float* __restrict__ scale, float* y32, RowIndex x_rows) {
  // Per warp: the features' sums, then (kNorm) each row's sum and sum of squares.
  constexpr int kSlots = kNorm ? kFeatures + 2 : kFeatures;
  __shared__ float partial_s[kWarps][kSlots][N];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups_per_block = kWarps / split;
  const int sub = warp % split;  // this warp's part of its features' rows
  const int64_t f0 =
      (static_cast<int64_t>(blockIdx.x) * groups_per_block + warp / split) * kFeatures;
  float acc[kSlots][N];  // kNorm: acc[kFeatures] the rows' sums, acc[kFeatures + 1] squares
#pragma unroll
  for (int k = 0; k < kSlots; ++k)
#pragma unroll
    for (int r = 0; r < N; ++r) acc[k][r] = 0.0f;
  // Rows past `out` (the last group) read row out - 1 again and are never stored.
  const uint4* wr[kFeatures];
#pragma unroll
  for (int k = 0; k < kFeatures; ++k) wr[k] = w + min(f0 + k, out - 1) * chunks;
  const int64_t stride = 32 * static_cast<int64_t>(split);
  const int64_t step = kUnroll * stride;
  int64_t c = sub * 32 + lane;
  // Positions past the row's end load nothing and add nothing.
  uint4 wv[kUnroll][kFeatures];
  auto load_weights = [&](int64_t at) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int k = 0; k < kFeatures; ++k)
        wv[u][k] = at + u * stride < chunks ? __ldcs(wr[k] + at + u * stride) : uint4{};
  };
  // The first weights are loaded before waiting for the kernel that writes x (weights are
  // constant): with programmatic dependent launch they stream while that kernel finishes.
  if (f0 < out) load_weights(c);
  // Lane k * N + r of the warps that store (the first of each split group) stores row r of
  // feature f0 + k. Its bias and row sum are constants: loaded now too. Loaded where they are
  // used, after the products and the block's barrier, they were dependent trips to memory at
  // the end of every GEMV, on the chain of kernels a decode step waits for. The folded-norm
  // instances, held to 64 registers, keep them in shared memory (in registers they spilled),
  // each thread its own slots; the others keep them in registers and read the residual (written
  // by an earlier kernel) right after the wait, in flight during the products.
  __shared__ float epilogue_s[kNorm ? 2 * kWarps * 32 : 1];
  float bias_v = 0.0f, res_v = 0.0f;
  const bool stores = sub == 0 && lane / N < kFeatures && f0 + lane / N < out;
  if (stores) {
    const float b = bias != nullptr ? to_float(bias[f0 + lane / N]) : 0.0f;
    if constexpr (kNorm) {
      epilogue_s[threadIdx.x] = b;
      epilogue_s[kWarps * 32 + threadIdx.x] = row_sums != nullptr ? row_sums[f0 + lane / N] : 0.0f;
    } else {
      bias_v = b;
    }
  }
  pdl_wait();
  pdl_trigger();
  if constexpr (kGather) {
    // A bad row (reported once) reads row 0: the step's results are not used.
    const long long row =
        gathered_row(x_rows, 0, kStatusGatherRow, blockIdx.x == 0 && threadIdx.x == 0);
    x += (row < 0 ? 0 : row) * chunks;
  }
  if (!kNorm && stores && residual != nullptr)
    res_v = to_float(residual[static_cast<int64_t>(lane % N) * out + f0 + lane / N]);
  // A folded LayerNorm works on x minus the row's first element: the sums of squares and the
  // products then do not cancel when the row's mean is large against its spread.
  float shift[N];
#pragma unroll
  for (int r = 0; r < N; ++r)
    shift[r] = kNorm && row_sums != nullptr
                   ? to_float(reinterpret_cast<const T*>(x + r * chunks)[0])
                   : 0.0f;
  if (f0 < out) {
    for (; c < chunks; c += step) {
      if (c != sub * 32 + lane) load_weights(c);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (c + u * stride >= chunks) break;
#pragma unroll
        for (int r = 0; r < N; ++r) {
          const uint4 xv = __ldg(x + r * chunks + c + u * stride);
          if constexpr (kNorm) {
            // The row's sums (the warps of a group cover its chunks once between them), and
            // the products with the shifted x.
            float xf[Vec<T>::kN];
            unpack<T>(xv, xf);
#pragma unroll
            for (int e = 0; e < Vec<T>::kN; ++e) {
              xf[e] -= shift[r];
              acc[kFeatures][r] += xf[e];
              acc[kFeatures + 1][r] = fmaf(xf[e], xf[e], acc[kFeatures + 1][r]);
            }
            if constexpr (kScale) {
              // The products take (x - shift) * gamma: the row sums are w · gamma's.
              const float4* g =
                  reinterpret_cast<const float4*>(scale) + (c + u * stride) * (Vec<T>::kN / 4);
#pragma unroll
              for (int q = 0; q < Vec<T>::kN / 4; ++q) {
                const float4 gv = __ldg(g + q);
                xf[4 * q] *= gv.x;
                xf[4 * q + 1] *= gv.y;
                xf[4 * q + 2] *= gv.z;
                xf[4 * q + 3] *= gv.w;
              }
            }
#pragma unroll
            for (int k = 0; k < kFeatures; ++k) {
              float wf[Vec<T>::kN];
              unpack<T>(wv[u][k], wf);
              float s = 0.0f;
#pragma unroll
              for (int e = 0; e < Vec<T>::kN; ++e) s = fmaf(wf[e], xf[e], s);
              acc[k][r] += s;
            }
          } else {
#pragma unroll
            for (int k = 0; k < kFeatures; ++k) acc[k][r] += dot16<T>(wv[u][k], xv);
          }
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kSlots; ++k)
#pragma unroll
    for (int r = 0; r < N; ++r) acc[k][r] = warp_sum(acc[k][r]);
  if (split > 1) {
    if (lane == 0)
#pragma unroll
      for (int k = 0; k < kSlots; ++k)
#pragma unroll
        for (int r = 0; r < N; ++r) partial_s[warp][k][r] = acc[k][r];
    __syncthreads();
    if (sub != 0) return;
#pragma unroll
    for (int k = 0; k < kSlots; ++k)
#pragma unroll
      for (int r = 0; r < N; ++r) {
        float s = 0.0f;
        for (int p = 0; p < split; ++p) s += partial_s[warp + p][k][r];
        acc[k][r] = s;
      }
  }
  // Lane k * N + r stores row r of feature f0 + k.
  const int kk = lane / N, rr = lane % N;
  if (kk >= kFeatures || f0 + kk >= out) return;
  float row_sum = 0.0f;
  if constexpr (kNorm) {
    bias_v = epilogue_s[threadIdx.x];
    row_sum = epilogue_s[kWarps * 32 + threadIdx.x];
  }
  float v = 0.0f;
#pragma unroll
  for (int k = 0; k < kFeatures; ++k)
#pragma unroll
    for (int r = 0; r < N; ++r)
      if (k == kk && r == rr) v = acc[k][r];
  const int64_t f = f0 + kk;
  if constexpr (kNorm) {
    float sum = 0.0f, squares = 0.0f;
#pragma unroll
    for (int r = 0; r < N; ++r)
      if (r == rr) {
        sum = acc[kFeatures][r];
        squares = acc[kFeatures + 1][r];
      }
    const float in = static_cast<float>(chunks * Vec<T>::kN);
    if (row_sums != nullptr) {
      // LayerNorm, with d = x - shift: rstd * (d · w - mean(d) * rowsum(w)) = rstd * (x - mean)
      // · w, var(x) = var(d).
      const float mean = sum / in;
      const float var = fmaxf(squares / in - mean * mean, 0.0f);
      v = rsqrtf(var + eps) * fmaf(-mean, row_sum, v);
    } else {  // RMSNorm (no shift)
      v *= rsqrtf(squares / in + eps);
    }
  }
  if (bias != nullptr) v += bias_v;
  v = round_as<T>(v);
  if (has_act) v = apply_act(act, v);
  const int64_t at = static_cast<int64_t>(rr) * out + f;
  // A fused residual add rounds like the Add it replaces: (residual + round(y)), rounded.
  if (residual != nullptr) v = round_as<T>(v) + (kNorm ? to_float(residual[at]) : res_v);
  if (y32 != nullptr)
    y32[at] = round_as<T>(v);  // a widened output: the same value, stored as f32
  else
    y[at] = from_float<T>(v);
}

template <typename T, typename B, int N>
void launch_n(const GemvParams& p, KernelStream stream) {
  const int64_t chunks = p.in / Vec<T>::kN;
  // The wide instance is one row without a gathered row or a norm scale (the lm_head's); the
  // flag is ignored elsewhere.
  const bool wide = p.wide && N == 1 && p.x_rows.index == nullptr && p.norm_scale == nullptr;
  const int split = wide ? wide_split(chunks) : p.split;
  const auto blocks = static_cast<unsigned>(grid_blocks(p.out, split));
  auto go = [&](auto kernel) {
    launch(kernel, blocks, kWarps * 32, 0, stream, static_cast<const uint4*>(p.x),
           static_cast<const uint4*>(p.w), static_cast<const B*>(p.bias),
           static_cast<const T*>(p.residual), static_cast<T*>(p.y), chunks, p.out, split, p.has_act,
           p.act, static_cast<const float*>(p.norm_row_sums), p.norm_eps, p.norm_scale, p.y32,
           p.x_rows);
  };
  // The folded norm's instances exist where launch_gemv lets p.norm through.
  if constexpr (std::is_same_v<T, B> && N <= kNormMaxRows) {
    const bool gather = p.x_rows.index != nullptr;
    if (p.norm && p.norm_scale != nullptr)
      return gather ? go(gemv_kernel<T, B, N, true, true, true>)
                    : go(gemv_kernel<T, B, N, true, true>);
    if (p.norm && wide) return go(gemv_kernel<T, B, N, true, false, false, kWideUnroll>);
    if (p.norm)
      return gather ? go(gemv_kernel<T, B, N, true, false, true>) : go(gemv_kernel<T, B, N, true>);
  }
  if constexpr (N == 1)
    if (wide) return go(gemv_kernel<T, B, N, false, false, false, kWideUnroll>);
  go(gemv_kernel<T, B, N, false>);
}

template <typename T, typename B>
void launch_rows(const GemvParams& p, KernelStream stream) {
  switch (p.rows) {
    case 1:
      return launch_n<T, B, 1>(p, stream);
    case 2:
      return launch_n<T, B, 2>(p, stream);
    case 3:
      return launch_n<T, B, 3>(p, stream);
    case 4:
      return launch_n<T, B, 4>(p, stream);
    case 5:
      return launch_n<T, B, 5>(p, stream);
    case 6:
      return launch_n<T, B, 6>(p, stream);
    case 7:
      return launch_n<T, B, 7>(p, stream);
    default:
      return launch_n<T, B, 8>(p, stream);
  }
}

}  // namespace

bool gemv_fits(FloatType t, const void* x, const void* w, int64_t in) {
  const int64_t elem = t == FloatType::kF32 ? 4 : 2;
  return in > 0 && (in * elem) % 16 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
         (reinterpret_cast<uintptr_t>(w) & 15) == 0;
}

int gemv_split(FloatType t, int64_t in, int64_t out, int sms, int warps_per_sm) {
  const int64_t chunks = row_chunks(t, in);
  // Enough warps to keep every SM's load units busy (about warps_per_sm per SM: 16 at one row,
  // 8 at more, CudaContext::gemv_warps_per_sm), but no more warps on a feature than leave each lane
  // at least one load. Fewer, longer blocks leave room on the SMs for the next kernel's blocks,
  // which start (programmatic dependent launch) and load their weights while this one ends.
  const int64_t groups = (out + kFeatures - 1) / kFeatures;
  int split = 1;
  while (split < kWarps && groups * split < static_cast<int64_t>(warps_per_sm) * sms &&
         chunks >= 64LL * split)
    split *= 2;
  return split;
}

int64_t gemv_wide_blocks(FloatType t, int64_t in, int64_t out) {
  return grid_blocks(out, wide_split(row_chunks(t, in)));
}

bool launch_gemv(const GemvParams& p, KernelStream stream) {
  // The folded norm's kernels: one row, a bias of the activations' type (or none).
  if (p.norm && (p.bias_type != p.type || p.rows > kNormMaxRows ||
                 (reinterpret_cast<uintptr_t>(p.norm_scale) & 15) != 0))
    return false;
  if (p.y32 != nullptr && p.residual != nullptr) return false;
  if (p.x_rows.index != nullptr && (!p.norm || p.rows != 1 || p.residual != nullptr)) return false;
  if (p.rows <= 0 || p.out <= 0) return true;
  dispatch_float(p.type, [&](auto tag) {
    dispatch_float(p.bias_type, [&](auto bias_tag) {
      launch_rows<decltype(tag), decltype(bias_tag)>(p, stream);
    });
  });
  return true;
}

}  // namespace kiln::cuda
