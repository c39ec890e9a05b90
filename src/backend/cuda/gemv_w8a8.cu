// The device side of W8A8 and fp8 Linears on CUDA (cuda_linear_w8a8.cc): x quantized with its
// static calibrated scale exactly as graph/linear.h defines it — int8 (quantize_input: x · (1 /
// s), a NaN as 0, clamped to ±127, rounded to nearest even, in f32) with int8 weights, integer
// products summed in int32; or E4M3 (quantize_input_fp8: saturating at ±448) with E4M3 weights,
// each product exact in f32 and summed in f32 — per-channel f32 weight scales, y = epilogue(Σ ·
// s · scale[o] + bias).
// - The GEMV of decode steps (up to 8 rows by default, 32 at most: cuda_linear_w8a8.cc): each
//   warp takes four features, each lane 8-byte loads of 8 weights and quantizes the 8 matching
//   x values of each row itself (x is a few KB, in L1/L2: every warp reads it), the products on
//   dp4a (four int8 products a instruction, int32 accumulation, exact; fp8: both widened to fp16
//   pairs exactly, then f32 FMAs). Steps of more rows run slices of 8 rows in the grid's y
//   dimension, reading the same weights at the same time (L2 serves all but the first).
// - Prefill-sized steps: x quantized into the node's scratch (quantize_rows), the int8 (FP8)
//   GEMM on cuBLASLt (int32 / f32 results), then the epilogue kernel (dequantize, bias,
//   activation, residual).
#include <cuda_fp8.h>

#include <type_traits>

#include "backend/cuda/gemv_common.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 8;     // per block
constexpr int kFeatures = 4;  // weight rows per warp
constexpr int kUnroll = 4;    // chunk positions a lane loads per pass
constexpr int kSliceRows = 8;

// quantize_input (graph/linear.h), bit for bit: one f32 multiply (no contraction), NaN as 0,
// clamped, rounded to nearest even.
__device__ __forceinline__ int quantize_one(float x, float inv) {
  float v = __fmul_rn(x, inv);
  if (v != v) v = 0.0f;
  v = fminf(fmaxf(v, -127.0f), 127.0f);
  return __float2int_rn(v);
}

// quantize_input_fp8 (graph/linear.h), bit for bit: the same multiply, NaN as 0, E4M3 rounded to
// nearest even saturating at ±448 (core/fp8.h); the E4M3 code.
__device__ __forceinline__ unsigned quantize_one_fp8(float x, float inv) {
  float v = __fmul_rn(x, inv);
  if (v != v) v = 0.0f;
  return static_cast<unsigned>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Four E4M3 codes (the low byte first) as floats, exactly (through fp16 pairs).
__device__ __forceinline__ void widen_fp8x4(unsigned codes, float (&out)[4]) {
  const __half2_raw lo =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes & 0xFFFFu), __NV_E4M3);
  const __half2_raw hi =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
}

__device__ __forceinline__ int pack4(int a, int b, int c, int d) {
  return static_cast<int>(
      (static_cast<unsigned>(a) & 0xFFu) | ((static_cast<unsigned>(b) & 0xFFu) << 8) |
      ((static_cast<unsigned>(c) & 0xFFu) << 16) | (static_cast<unsigned>(d) << 24));
}

// Elements 8c .. 8c + 7 of row x quantized, as two words of four int8 (E4M3) codes (element 8c
// in the low byte of the first), the byte order of the weights' 8-byte chunks.
template <typename T, bool kFp8>
__device__ __forceinline__ int2 load_quantized(const T* __restrict__ x, int64_t c, float inv) {
  float f[8];
  if constexpr (sizeof(T) == 4) {
    const float4* p = reinterpret_cast<const float4*>(x) + 2 * c;
    const float4 a = __ldg(p), b = __ldg(p + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x) + c);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int u = 0; u < 8; ++u) f[u] = to_float(e[u]);
  }
  int q[8];
#pragma unroll
  for (int u = 0; u < 8; ++u)
    q[u] = kFp8 ? static_cast<int>(quantize_one_fp8(f[u], inv)) : quantize_one(f[u], inv);
  return make_int2(pack4(q[0], q[1], q[2], q[3]), pack4(q[4], q[5], q[6], q[7]));
}

// Eight E4M3 codes (an 8-byte chunk, element 0 in the low byte of .x) as floats, exactly.
__device__ __forceinline__ void widen_fp8x8(const uint2& codes, float (&out)[8]) {
  float lo[4], hi[4];
  widen_fp8x4(codes.x, lo);
  widen_fp8x4(codes.y, hi);
#pragma unroll
  for (int e = 0; e < 4; ++e) out[e] = lo[e], out[4 + e] = hi[e];
}

// The store every W8A8 path shares: the integer sum dequantized (Σ · s · scale), the bias added,
// rounded to T, the activation, a fused residual (rounded again, as the Add it replaces), and a
// widened output as T's value in f32.
template <typename T, typename B, typename Acc>
__device__ __forceinline__ void store_output(Acc sum, float x_scale, float scale, float bias,
                                             bool has_act, ActFn act, const T* residual, T* y,
                                             float* y32, int64_t at) {
  float v = __fmul_rn(__fmul_rn(static_cast<float>(sum), x_scale), scale) + bias;
  v = round_as<T>(v);
  if (has_act) v = apply_act(act, v);
  if (residual != nullptr) v = round_as<T>(v) + to_float(residual[at]);
  if (y32 != nullptr)
    y32[at] = round_as<T>(v);
  else
    y[at] = from_float<T>(v);
}

// Rows row_base + blockIdx.y * N .. + N of y; chunks = in / 8. Split warps share a group of
// features (over interleaved chunks), their sums added in a fixed order. kFp8: E4M3 weights and
// inputs, f32 sums; else int8, int32 sums.
template <typename T, typename B, int N, bool kFp8 = false>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_w8a8_kernel(const T* __restrict__ x, const uint2* __restrict__ w,
                     const float* __restrict__ scales, float x_scale, float inv,
                     const B* __restrict__ bias, const T* residual, T* y, float* y32,
                     int64_t chunks, int64_t out, int64_t row_base, int split, bool has_act,
                     ActFn act) {
  using Acc = std::conditional_t<kFp8, float, int>;
  __shared__ Acc partial_s[kWarps][kFeatures][N];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups_per_block = kWarps / split;
  const int sub = warp % split;
  const int64_t f0 =
      (static_cast<int64_t>(blockIdx.x) * groups_per_block + warp / split) * kFeatures;
  const int64_t row0 = row_base + static_cast<int64_t>(blockIdx.y) * N;
  x += row0 * chunks * 8;
  Acc acc[kFeatures][N];
#pragma unroll
  for (int k = 0; k < kFeatures; ++k)
#pragma unroll
    for (int r = 0; r < N; ++r) acc[k][r] = 0;
  const uint2* wr[kFeatures];
#pragma unroll
  for (int k = 0; k < kFeatures; ++k) wr[k] = w + min(f0 + k, out - 1) * chunks;
  const int64_t stride = 32 * static_cast<int64_t>(split), step = kUnroll * stride;
  int64_t c = sub * 32 + lane;
  uint2 wv[kUnroll][kFeatures];
  auto load_weights = [&](int64_t at) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int k = 0; k < kFeatures; ++k)
        wv[u][k] = at + u * stride < chunks ? __ldcs(wr[k] + at + u * stride) : uint2{};
  };
  // Weights are constants: the first are in flight before the wait for the kernel writing x.
  if (f0 < out) load_weights(c);
  const int kk = lane / N, rr = lane % N;
  const bool stores = sub == 0 && kk < kFeatures && f0 + kk < out;
  float scale_v = 0.0f, bias_v = 0.0f;
  if (stores) {
    scale_v = scales[f0 + kk];
    bias_v = bias != nullptr ? to_float(bias[f0 + kk]) : 0.0f;
  }
  pdl_wait();
  pdl_trigger();
  if (f0 < out) {
    for (; c < chunks; c += step) {
      if (c != sub * 32 + lane) load_weights(c);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (c + u * stride >= chunks) break;
        if constexpr (kFp8) {
          // The chunk's weights widened once for every row, each row's x once for every feature.
          float wf[kFeatures][8];
#pragma unroll
          for (int k = 0; k < kFeatures; ++k) widen_fp8x8(wv[u][k], wf[k]);
#pragma unroll
          for (int r = 0; r < N; ++r) {
            const int2 xq = load_quantized<T, true>(x + r * chunks * 8, c + u * stride, inv);
            float xf[8];
            widen_fp8x8(make_uint2(static_cast<unsigned>(xq.x), static_cast<unsigned>(xq.y)), xf);
#pragma unroll
            for (int k = 0; k < kFeatures; ++k)
#pragma unroll
              for (int e = 0; e < 8; ++e) acc[k][r] = fmaf(wf[k][e], xf[e], acc[k][r]);
          }
        } else {
#pragma unroll
          for (int r = 0; r < N; ++r) {
            const int2 xq = load_quantized<T, false>(x + r * chunks * 8, c + u * stride, inv);
#pragma unroll
            for (int k = 0; k < kFeatures; ++k) {
              acc[k][r] = __dp4a(static_cast<int>(wv[u][k].x), xq.x, acc[k][r]);
              acc[k][r] = __dp4a(static_cast<int>(wv[u][k].y), xq.y, acc[k][r]);
            }
          }
        }
      }
    }
  }
  if (!reduce_feature_group(acc, partial_s, warp, lane, sub, split)) return;
  if (!stores) return;
  const Acc v = lane_sum<kFeatures>(acc, kk, rr);
  store_output<T, B, Acc>(v, x_scale, scale_v, bias_v, has_act, act, residual, y, y32,
                          (row0 + rr) * out + f0 + kk);
}

// The step's rows as slices of 8 rows and a rest (gemv_common.cuh).
template <typename T, typename B>
void launch_rows(const GemvW8a8Params& p, KernelStream stream) {
  const W8a8Store& o = p.store;
  const int64_t groups = (o.out + kFeatures - 1) / kFeatures, per_block = kWarps / p.split;
  const auto blocks = static_cast<unsigned>((groups + per_block - 1) / per_block);
  launch_row_slices<kSliceRows>(o.rows, [&](auto n, int64_t row_base, unsigned slices) {
    constexpr int N = decltype(n)::value;
    launch(p.fp8 ? gemv_w8a8_kernel<T, B, N, true> : gemv_w8a8_kernel<T, B, N, false>,
           dim3(blocks, slices), kWarps * 32, 0, stream, static_cast<const T*>(p.x),
           reinterpret_cast<const uint2*>(p.w), o.scales, o.x_scale, p.inv_scale,
           static_cast<const B*>(o.bias), static_cast<const T*>(o.residual), static_cast<T*>(o.y),
           o.y32, p.in / 8, o.out, row_base, p.split, o.has_act, o.act);
  });
}

// q[i] = quantize_input(x[i]) (kFp8: quantize_input_fp8's code), four elements a thread (n a
// multiple of 4, q 4-byte aligned).
template <typename T, bool kFp8>
__global__ void quantize_rows_kernel(const T* __restrict__ x, float inv, int* q, int64_t quads) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < quads;
       i += int64_t(gridDim.x) * blockDim.x) {
    const T* e = x + 4 * i;
    int c[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      c[u] = kFp8 ? static_cast<int>(quantize_one_fp8(to_float(e[u]), inv))
                  : quantize_one(to_float(e[u]), inv);
    q[i] = pack4(c[0], c[1], c[2], c[3]);
  }
}

// y [rows, out] from the sums acc [rows, out] (the int8 GEMM's int32, the FP8 GEMM's f32).
template <typename T, typename B, typename Acc>
__global__ void w8a8_epilogue_kernel(const Acc* __restrict__ acc, const float* __restrict__ scales,
                                     float x_scale, const B* __restrict__ bias, const T* residual,
                                     T* y, float* y32, int64_t n, int64_t out, bool has_act,
                                     ActFn act) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * out;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = i % out;
    store_output<T, B, Acc>(acc[i], x_scale, scales[o], bias != nullptr ? to_float(bias[o]) : 0.0f,
                            has_act, act, residual, y, y32, i);
  }
}

}  // namespace

int gemv_w8a8_warps_per_sm(FloatType t, int64_t rows, bool fp8) {
  int blocks = 0;
  auto query = [&](auto kernel) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, 0) !=
        cudaSuccess) {
      (void)cudaGetLastError();  // not left for the next launch's check
      blocks = 1;
    }
  };
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    if (rows == 1)
      fp8 ? query(gemv_w8a8_kernel<T, T, 1, true>) : query(gemv_w8a8_kernel<T, T, 1>);
    else
      fp8 ? query(gemv_w8a8_kernel<T, T, kSliceRows, true>)
          : query(gemv_w8a8_kernel<T, T, kSliceRows>);
  });
  return std::max(blocks, 1) * kWarps;
}

bool gemv_w8a8_fits(const void* x, const void* w, int64_t in) {
  return in > 0 && in % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
         (reinterpret_cast<uintptr_t>(w) & 7) == 0;
}

void launch_gemv_w8a8(const GemvW8a8Params& p, KernelStream stream) {
  if (p.store.rows <= 0 || p.store.out <= 0) return;
  dispatch_float(p.store.type, [&](auto tag) {
    dispatch_float(p.store.bias_type, [&](auto bias_tag) {
      launch_rows<decltype(tag), decltype(bias_tag)>(p, stream);
    });
  });
}

void launch_quantize_rows(FloatType t, bool fp8, const void* x, float inv_scale, void* q, int64_t n,
                          KernelStream stream) {
  if (n == 0) return;
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch(fp8 ? quantize_rows_kernel<T, true> : quantize_rows_kernel<T, false>,
           grid_for(n / 4, 256), 256, 0, stream, static_cast<const T*>(x), inv_scale,
           static_cast<int*>(q), n / 4);
  });
}

void launch_w8a8_epilogue(const W8a8EpilogueParams& p, KernelStream stream) {
  const W8a8Store& o = p.store;
  const int64_t n = o.rows * o.out;
  if (n == 0) return;
  dispatch_float(o.type, [&](auto tag) {
    dispatch_float(o.bias_type, [&](auto bias_tag) {
      using T = decltype(tag);
      using B = decltype(bias_tag);
      auto go = [&](auto acc_tag) {
        using Acc = decltype(acc_tag);
        launch(w8a8_epilogue_kernel<T, B, Acc>, grid_for(n, 256), 256, 0, stream,
               static_cast<const Acc*>(p.acc), o.scales, o.x_scale, static_cast<const B*>(o.bias),
               static_cast<const T*>(o.residual), static_cast<T*>(o.y), o.y32, o.rows, o.out,
               o.has_act, o.act);
      };
      if (p.float_acc)
        go(float{});
      else
        go(int{});
    });
  });
}

}  // namespace kiln::cuda
