// The Linear of int8-weight and int4-weight plans on CUDA (cuda_linear_i8.cc): fp16/bf16
// activations (f32 for the Linears an fp16 T5 plan keeps in f32), int8 weights q [out, in] with
// one f32 scale per output channel, y = epilogue((x · q^T) · scale[o] + bias), or int4 weights
// (two a byte, graph/linear.h) with f16 scales per output channel and group of 128 inputs
// (each chunk's sum times its group's scale). Decode streams the weights, so the GEMV reads half
// (a quarter) of the bytes of an fp16 plan's: each warp takes four features, each lane 8-byte
// loads of 8 int8 (16 int4) weights, four chunk positions of the four features in flight before
// it multiplies them into the slice's rows. A step of more rows runs slices of 8 rows in the
// grid's y dimension, which read the same weights at the same time (L2 serves all but the
// first). The bytes (nibbles) become floats exactly without a conversion instruction each: the
// byte (xor 0x80, so 0..255; a nibble xor 8, 0..15) is put under the exponent of 2^23, and 2^23 +
// 128 (2^23 + 8) subtracted. A folded input
// norm (fuse_norm_linear: gamma as the norm scale, the row sums of q · gamma) runs inside the
// one-row GEMV as in the float one (gemv.cu): the lanes add up the row's sum and sum of squares
// from the x chunks they multiply anyway, multiply x by gamma on the fly, and the store applies
// mean and 1 / std (or 1 / rms) before the channel's scale. Prefill-sized steps widen the weights
// into fp16/bf16 slices for cuBLASLt instead (dequantize_i8_rows).
#include "backend/cuda/gemv_common.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 8;     // per block
constexpr int kFeatures = 4;  // weight rows per warp
constexpr int kUnroll = 4;    // chunk positions a lane loads per pass
constexpr int kSliceRows = 8;

// The 8 int8 weights of w as floats, exactly: 0x4B0000bb is 2^23 + bb.
__device__ __forceinline__ void unpack_i8(const uint2& w, float (&out)[8]) {
  const unsigned lo = w.x ^ 0x80808080u, hi = w.y ^ 0x80808080u;
  constexpr float kBias = 8388608.0f + 128.0f;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const unsigned sel = 0x7440u | static_cast<unsigned>(b);  // bytes: w's b-th, 0, 0, 0x4B
    out[b] = __uint_as_float(__byte_perm(lo, 0x4B000000u, sel)) - kBias;
    out[4 + b] = __uint_as_float(__byte_perm(hi, 0x4B000000u, sel)) - kBias;
  }
}

// The 16 int4 weights of w (element 2j in byte j's low nibble) as floats, exactly: 0x4B0000bb is
// 2^23 + bb.
__device__ __forceinline__ void unpack_i4(const uint2& w, float (&out)[16]) {
  constexpr float kBias = 8388608.0f + 8.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const unsigned word = (h == 0 ? w.x : w.y) ^ 0x88888888u;  // nibbles as q + 8
    const unsigned even = word & 0x0F0F0F0Fu, odd = (word >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const unsigned sel = 0x7440u | static_cast<unsigned>(b);  // bytes: the b-th, 0, 0, 0x4B
      out[8 * h + 2 * b] = __uint_as_float(__byte_perm(even, 0x4B000000u, sel)) - kBias;
      out[8 * h + 2 * b + 1] = __uint_as_float(__byte_perm(odd, 0x4B000000u, sel)) - kBias;
    }
  }
}

// A weight chunk (one 8-byte load) of the format as floats: 8 int8 or 16 int4 weights.
template <bool kI4>
constexpr int kChunkElems = kI4 ? 16 : 8;
template <bool kI4>
__device__ __forceinline__ void unpack_chunk(const uint2& w, float (&out)[kChunkElems<kI4>]) {
  if constexpr (kI4)
    unpack_i4(w, out);
  else
    unpack_i8(w, out);
}

// Elements E c .. E c + E - 1 of row x as floats (E a multiple of 8): 16-byte loads of halves,
// of floats.
template <typename T, int E>
__device__ __forceinline__ void load_x(const T* __restrict__ x, int64_t c, float (&out)[E]) {
  if constexpr (sizeof(T) == 4) {
    const float4* p = reinterpret_cast<const float4*>(x) + (E / 4) * c;
#pragma unroll
    for (int q = 0; q < E / 4; ++q) {
      const float4 a = __ldg(p + q);
      out[4 * q] = a.x, out[4 * q + 1] = a.y, out[4 * q + 2] = a.z, out[4 * q + 3] = a.w;
    }
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(x) + (E / 8) * c;
#pragma unroll
    for (int h = 0; h < E / 8; ++h) {
      const uint4 raw = __ldg(p + h);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int u = 0; u < 8; ++u) out[8 * h + u] = to_float(e[u]);
    }
  }
}

// Rows row_base + blockIdx.y * N .. + N of y. chunks = in / E (E = kChunkElems: the weights of
// one 8-byte load); split warps share a group of features (over interleaved chunks), their sums
// added in a fixed order. kI4: int4 weights, group_scales f16 [out, in / 128] (each chunk lies in
// one group), scales unused. kNorm (N = 1): a folded norm, LayerNorm with row_sums (on x minus
// its first element, as gemv.cu), RMSNorm without; gamma (f32 [in], null: 1) multiplies x.
template <typename T, typename B, int N, bool kNorm = false, bool kI4 = false>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_i8_kernel(const T* __restrict__ x, const uint2* __restrict__ w,
                   const float* __restrict__ scales, const __half* __restrict__ group_scales,
                   const B* __restrict__ bias, const T* residual, T* y, float* y32, int64_t chunks,
                   int64_t out, int64_t row_base, int split, bool has_act, ActFn act,
                   const float* __restrict__ gamma, const float* __restrict__ row_sums, float eps) {
  static_assert(!kNorm || N == 1, "a folded norm runs at one row");
  constexpr int E = kChunkElems<kI4>;
  constexpr int kPerGroup = 128 / E;  // chunks a group of 128 inputs (int4 scales)
  const int64_t groups = (chunks + kPerGroup - 1) / kPerGroup;
  // Per warp: the features' sums, then (kNorm) the row's sum and sum of squares.
  constexpr int kSlots = kNorm ? kFeatures + 2 : kFeatures;
  __shared__ float partial_s[kWarps][kSlots][N];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups_per_block = kWarps / split;
  const int sub = warp % split;
  const int64_t f0 =
      (static_cast<int64_t>(blockIdx.x) * groups_per_block + warp / split) * kFeatures;
  const int64_t row0 = row_base + static_cast<int64_t>(blockIdx.y) * N;
  x += row0 * chunks * E;
  float acc[kSlots][N];  // kNorm: acc[kFeatures] the row's sum, acc[kFeatures + 1] its squares
#pragma unroll
  for (int k = 0; k < kSlots; ++k)
#pragma unroll
    for (int r = 0; r < N; ++r) acc[k][r] = 0.0f;
  const uint2* wr[kFeatures];
#pragma unroll
  for (int k = 0; k < kFeatures; ++k) wr[k] = w + min(f0 + k, out - 1) * chunks;
  const int64_t stride = 32 * static_cast<int64_t>(split), step = kUnroll * stride;
  int64_t c = sub * 32 + lane;
  uint2 wv[kUnroll][kFeatures];
  // int4: each loaded chunk's group scale, loaded with it (constants).
  __half gs[kI4 ? kUnroll : 1][kFeatures];
  auto load_weights = [&](int64_t at) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int k = 0; k < kFeatures; ++k) {
        const bool in_row = at + u * stride < chunks;
        wv[u][k] = in_row ? __ldcs(wr[k] + at + u * stride) : uint2{};
        if constexpr (kI4)
          gs[u][k] =
              in_row ? group_scales[min(f0 + k, out - 1) * groups + (at + u * stride) / kPerGroup]
                     : __half{};
      }
  };
  // Weights are constants: the first are in flight before the wait for the kernel writing x.
  if (f0 < out) load_weights(c);
  const int kk = lane / N, rr = lane % N;
  const bool stores = sub == 0 && kk < kFeatures && f0 + kk < out;
  float scale_v = 0.0f, bias_v = 0.0f, row_sum = 0.0f;
  if (stores) {
    scale_v = kI4 ? 1.0f : scales[f0 + kk];
    bias_v = bias != nullptr ? to_float(bias[f0 + kk]) : 0.0f;
    if (kNorm && row_sums != nullptr) row_sum = row_sums[f0 + kk];
  }
  pdl_wait();
  pdl_trigger();
  float res_v = 0.0f;
  if (stores && residual != nullptr) res_v = to_float(residual[(row0 + rr) * out + f0 + kk]);
  // A folded LayerNorm works on x minus the row's first element (the sums of squares then do not
  // cancel when the row's mean is large against its spread).
  const float shift = kNorm && row_sums != nullptr ? to_float(x[0]) : 0.0f;
  if (f0 < out) {
    for (; c < chunks; c += step) {
      if (c != sub * 32 + lane) load_weights(c);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (c + u * stride >= chunks) break;
        float wf[kFeatures][E];
#pragma unroll
        for (int k = 0; k < kFeatures; ++k) unpack_chunk<kI4>(wv[u][k], wf[k]);
#pragma unroll
        for (int r = 0; r < N; ++r) {
          float xf[E];
          load_x<T, E>(x + r * chunks * E, c + u * stride, xf);
          if constexpr (kNorm) {
#pragma unroll
            for (int e = 0; e < E; ++e) {
              xf[e] -= shift;
              acc[kFeatures][r] += xf[e];
              acc[kFeatures + 1][r] = fmaf(xf[e], xf[e], acc[kFeatures + 1][r]);
            }
            if (gamma != nullptr) {
              const float4* gv =
                  reinterpret_cast<const float4*>(gamma) + (E / 4) * (c + u * stride);
#pragma unroll
              for (int q = 0; q < E / 4; ++q) {
                const float4 g4 = __ldg(gv + q);
                xf[4 * q] *= g4.x, xf[4 * q + 1] *= g4.y;
                xf[4 * q + 2] *= g4.z, xf[4 * q + 3] *= g4.w;
              }
            }
          }
#pragma unroll
          for (int k = 0; k < kFeatures; ++k) {
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < E; ++e) s = fmaf(wf[k][e], xf[e], s);
            if constexpr (kI4)
              acc[k][r] = fmaf(__half2float(gs[u][k]), s, acc[k][r]);
            else
              acc[k][r] += s;
          }
        }
      }
    }
  }
  if (!reduce_feature_group(acc, partial_s, warp, lane, sub, split)) return;
  if (!stores) return;
  float v = lane_sum<kFeatures>(acc, kk, rr);
  if constexpr (kNorm) {
    // The row's sums (N = 1: slot 0); LayerNorm with d = x - shift: rstd * (d · (q gamma) -
    // mean(d) * rowsum(q gamma)) = rstd * ((x - mean) gamma) · q, var(x) = var(d).
    const float in = static_cast<float>(chunks * E);
    const float sum = acc[kFeatures][0], squares = acc[kFeatures + 1][0];
    if (row_sums != nullptr) {
      const float mean = sum / in;
      const float var = fmaxf(squares / in - mean * mean, 0.0f);
      v = rsqrtf(var + eps) * fmaf(-mean, row_sum, v);
    } else {
      v *= rsqrtf(squares / in + eps);
    }
  }
  v = v * scale_v + bias_v;
  v = round_as<T>(v);
  if (has_act) v = apply_act(act, v);
  const int64_t at = (row0 + rr) * out + f0 + kk;
  if (residual != nullptr) v = round_as<T>(v) + res_v;
  if (y32 != nullptr)
    y32[at] = round_as<T>(v);
  else
    y[at] = from_float<T>(v);
}

template <typename T, typename B, int N>
void launch_slices(const GemvI8Params& p, int64_t row_base, unsigned slices, KernelStream stream) {
  const bool i4 = p.group_scales != nullptr;
  const int64_t chunks = p.in / (i4 ? kChunkElems<true> : kChunkElems<false>);
  const int64_t groups = (p.out + kFeatures - 1) / kFeatures, per_block = kWarps / p.split;
  const dim3 grid(static_cast<unsigned>((groups + per_block - 1) / per_block), slices);
  auto go = [&](auto kernel) {
    launch(kernel, grid, kWarps * 32, 0, stream, static_cast<const T*>(p.x),
           reinterpret_cast<const uint2*>(p.w), p.scales,
           static_cast<const __half*>(p.group_scales), static_cast<const B*>(p.bias),
           static_cast<const T*>(p.residual), static_cast<T*>(p.y), p.y32, chunks, p.out, row_base,
           p.split, p.has_act, p.act, p.norm_scale, p.norm_row_sums, p.norm_eps);
  };
  if constexpr (N == 1)
    if (p.norm)
      return i4 ? go(gemv_i8_kernel<T, B, 1, true, true>) : go(gemv_i8_kernel<T, B, 1, true>);
  if (i4) return go(gemv_i8_kernel<T, B, N, false, true>);
  go(gemv_i8_kernel<T, B, N>);
}

// The step's rows as slices of 8 rows and a rest (gemv_common.cuh).
template <typename T, typename B>
void launch_rows(const GemvI8Params& p, KernelStream stream) {
  launch_row_slices<kSliceRows>(p.rows, [&](auto n, int64_t row_base, unsigned slices) {
    launch_slices<T, B, decltype(n)::value>(p, row_base, slices, stream);
  });
}

// w [rows, in] = round(q · scale[row]), grid-stride over 8-weight chunks.
template <typename T>
__global__ void dequantize_kernel(const uint2* __restrict__ q, const float* __restrict__ scales,
                                  T* w, int64_t chunks_per_row, int64_t chunks) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    float f[8];
    unpack_i8(__ldcs(q + i), f);
    const float s = scales[i / chunks_per_row];
    if constexpr (sizeof(T) == 4) {
      float4* out = reinterpret_cast<float4*>(w) + 2 * i;
      out[0] = make_float4(f[0] * s, f[1] * s, f[2] * s, f[3] * s);
      out[1] = make_float4(f[4] * s, f[5] * s, f[6] * s, f[7] * s);
    } else {
      T v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = from_float<T>(f[e] * s);
      reinterpret_cast<uint4*>(w)[i] = *reinterpret_cast<const uint4*>(v);
    }
  }
}

// w [rows, in] = round(q · scale[row][group]), int4 q (in a multiple of 16), grid-stride over
// 16-weight chunks.
template <typename T>
__global__ void dequantize_i4_kernel(const uint2* __restrict__ q, const __half* __restrict__ scales,
                                     T* w, int64_t chunks_per_row, int64_t groups, int64_t chunks) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    float f[16];
    unpack_i4(__ldcs(q + i), f);
    const int64_t row = i / chunks_per_row, col = (i % chunks_per_row) * 16;
    const float s = __half2float(scales[row * groups + col / 128]);
    if constexpr (sizeof(T) == 4) {
      float4* out = reinterpret_cast<float4*>(w) + 4 * i;
#pragma unroll
      for (int v = 0; v < 4; ++v)
        out[v] = make_float4(f[4 * v] * s, f[4 * v + 1] * s, f[4 * v + 2] * s, f[4 * v + 3] * s);
    } else {
      T v[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) v[e] = from_float<T>(f[e] * s);
      reinterpret_cast<uint4*>(w)[2 * i] = reinterpret_cast<const uint4*>(v)[0];
      reinterpret_cast<uint4*>(w)[2 * i + 1] = reinterpret_cast<const uint4*>(v)[1];
    }
  }
}

}  // namespace

int gemv_i8_warps_per_sm(FloatType t, int64_t rows, bool i4) {
  int blocks = 0;
  auto query = [&](auto kernel) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, 0) !=
        cudaSuccess) {
      (void)cudaGetLastError();  // not left for the next launch's check
      blocks = 1;
    }
  };
  const bool one = rows == 1;
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    if (one && i4)
      query(gemv_i8_kernel<T, T, 1, false, true>);
    else if (i4)
      query(gemv_i8_kernel<T, T, kSliceRows, false, true>);
    else if (one)
      query(gemv_i8_kernel<T, T, 1>);
    else
      query(gemv_i8_kernel<T, T, kSliceRows>);
  });
  return std::max(blocks, 1) * kWarps;
}

bool gemv_i8_fits(const void* x, const void* w, int64_t in, bool i4) {
  return in > 0 && in % (i4 ? 16 : 8) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
         (reinterpret_cast<uintptr_t>(w) & 7) == 0;
}

bool launch_gemv_i8(const GemvI8Params& p, KernelStream stream) {
  // The folded norm: one row, gamma 16-byte aligned (float4 loads).
  if (p.norm && (p.rows != 1 || (reinterpret_cast<uintptr_t>(p.norm_scale) & 15) != 0))
    return false;
  if (p.rows <= 0 || p.out <= 0) return true;
  dispatch_float(p.type, [&](auto tag) {
    dispatch_float(p.bias_type, [&](auto bias_tag) {
      launch_rows<decltype(tag), decltype(bias_tag)>(p, stream);
    });
  });
  return true;
}

void launch_dequantize_i4(FloatType t, const void* q, const void* scales, void* w, int64_t rows,
                          int64_t in, KernelStream stream) {
  const int64_t chunks = rows * in / 16;
  if (chunks == 0) return;
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch(dequantize_i4_kernel<T>, grid_for(chunks, 256), 256, 0, stream,
           static_cast<const uint2*>(q), static_cast<const __half*>(scales), static_cast<T*>(w),
           in / 16, (in + 127) / 128, chunks);
  });
}

void launch_dequantize_i8(FloatType t, const int8_t* q, const float* scales, void* w, int64_t rows,
                          int64_t in, KernelStream stream) {
  const int64_t chunks = rows * in / 8;
  if (chunks == 0) return;
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch(dequantize_kernel<T>, grid_for(chunks, 256), 256, 0, stream,
           reinterpret_cast<const uint2*>(q), scales, static_cast<T*>(w), in / 8, chunks);
  });
}

}  // namespace kiln::cuda
