// Row kernels: RMSNorm (T5: no mean, no bias), LayerNorm, the fused residual add + RMSNorm and
// softmax. One block per row; statistics accumulate in fp32 over the row's values as stored.
// Rows of whole 16-byte vectors take the norms' vector kernels.
#include <initializer_list>

#include "backend/cuda/device_types.cuh"

namespace kiln::cuda {
namespace {

int threads_for(int64_t d) {
  if (d >= 1024) return 1024;
  if (d >= 256) return 256;
  return 64;
}

template <typename T, typename W>
__global__ void rms_norm_kernel(const T* x, const W* w, T* y, int64_t d, float eps) {
  pdl_begin();
  const T* xr = x + blockIdx.x * d;
  T* yr = y + blockIdx.x * d;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = to_float(xr[i]);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    yr[i] = from_float<T>(to_float(w[i]) * (to_float(xr[i]) * inv_rms));
}

template <typename T, typename W>
__global__ void add_rms_norm_kernel(const T* a, const T* b, const W* w, T* sum, T* y, int64_t d,
                                    float eps) {
  pdl_begin();
  const int64_t base = blockIdx.x * d;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    // The norm reads the sum as stored (rounded to T), as the unfused pair would.
    const T s = from_float<T>(to_float(a[base + i]) + to_float(b[base + i]));
    sum[base + i] = s;
    const float v = to_float(s);
    sum_sq += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(d) + eps);
  // Each thread reads back only the elements it wrote.
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    y[base + i] = from_float<T>(to_float(w[i]) * (to_float(sum[base + i]) * inv_rms));
}

// The row of x that output row blockIdx.x normalizes (RowIndex), or -1 after reporting a bad
// index (the whole block returns). Reads the index: after the wait.
__device__ __forceinline__ int64_t source_row(const RowIndex& g) {
  if (g.index == nullptr) return blockIdx.x;
  return gathered_row(g, blockIdx.x, kStatusTokenId, threadIdx.x == 0);
}

template <typename T, typename W>
__global__ void layer_norm_kernel(const T* x, const W* w, const W* b, T* y, int64_t d, float eps,
                                  RowIndex gather) {
  pdl_begin();
  const int64_t row = source_row(gather);
  if (row < 0) return;
  const T* xr = x + row * d;
  T* yr = y + blockIdx.x * d;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += to_float(xr[i]);
  const float mean = block_sum(s) / static_cast<float>(d);
  float var = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float c = to_float(xr[i]) - mean;
    var += c * c;
  }
  const float inv_std = rsqrtf(block_sum(var) / static_cast<float>(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    yr[i] = from_float<T>((to_float(xr[i]) - mean) * inv_std * to_float(w[i]) + to_float(b[i]));
}

// The three norms on rows of whole 16-byte vectors (vec_fits): a thread per vector of the row
// (a 1024-wide fp16 row is 128 threads with one 16-byte load each, not 1024 threads with a
// 2-byte load each and a 32-warp reduction). The same arithmetic per element; the fp32 sums
// group the row's values differently. Each thread's first vector of the weights (and bias) is
// loaded before the wait for the kernel before it: loaded at the store, they were a trip to
// memory at the end of the kernel, on the chain a decode step waits for. Rows of at most one
// vector a thread (d <= 8 * 1024 in fp16) keep their values in registers between the passes.
template <typename W, int N>
struct RowWeights {
  float w[N], b[N];
};
template <typename W, int N>
__device__ __forceinline__ RowWeights<W, N> first_weights(const W* w, const W* b, int64_t vecs) {
  RowWeights<W, N> r{};
  const int64_t c = threadIdx.x;
  if (c >= vecs) return r;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    r.w[k] = to_float(w[c * N + k]);
    r.b[k] = b != nullptr ? to_float(b[c * N + k]) : 0.0f;
  }
  return r;
}

template <typename T, typename W>
__global__ void rms_norm_vec_kernel(const T* x, const W* w, T* y, int64_t d, float eps) {
  constexpr int N = kVec<T>;
  const int64_t vecs = d / N;
  const RowWeights<W, N> first = first_weights<W, N>(w, nullptr, vecs);
  pdl_begin();
  const T* xr = x + blockIdx.x * d;
  T* yr = y + blockIdx.x * d;
  if (vecs <= static_cast<int64_t>(blockDim.x)) {  // one vector a thread (uniform)
    const int64_t c = threadIdx.x;
    float v[N] = {};
    if (c < vecs) load_vec(xr + c * N, v);
    float sum_sq = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) sum_sq += v[k] * v[k];
    const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(d) + eps);
    if (c >= vecs) return;
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = first.w[k] * (v[k] * inv_rms);
    store_vec(yr + c * N, v);
    return;
  }
  float sum_sq = 0.0f;
  for (int64_t c = threadIdx.x; c < vecs; c += blockDim.x) {
    float v[N];
    load_vec(xr + c * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k) sum_sq += v[k] * v[k];
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(d) + eps);
  for (int64_t c = threadIdx.x; c < vecs; c += blockDim.x) {
    float v[N];
    load_vec(xr + c * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k)
      v[k] = (c == threadIdx.x ? first.w[k] : to_float(w[c * N + k])) * (v[k] * inv_rms);
    store_vec(yr + c * N, v);
  }
}

template <typename T, typename W>
__global__ void add_rms_norm_vec_kernel(const T* a, const T* b, const W* w, T* sum, T* y, int64_t d,
                                        float eps) {
  constexpr int N = kVec<T>;
  const int64_t vecs = d / N;
  const RowWeights<W, N> first = first_weights<W, N>(w, nullptr, vecs);
  pdl_begin();
  const int64_t base = blockIdx.x * d;
  if (vecs <= static_cast<int64_t>(blockDim.x)) {  // one vector a thread (uniform)
    const int64_t c = threadIdx.x;
    float va[N] = {}, vb[N] = {};
    if (c < vecs) {
      load_vec(a + base + c * N, va);
      load_vec(b + base + c * N, vb);
    }
    float sum_sq = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      va[k] = round_as<T>(va[k] + vb[k]);  // the sum as stored, as the unfused pair reads it
      sum_sq += va[k] * va[k];
    }
    if (c < vecs) store_vec(sum + base + c * N, va);
    const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(d) + eps);
    if (c >= vecs) return;
#pragma unroll
    for (int k = 0; k < N; ++k) va[k] = first.w[k] * (va[k] * inv_rms);
    store_vec(y + base + c * N, va);
    return;
  }
  float sum_sq = 0.0f;
  for (int64_t c = threadIdx.x; c < vecs; c += blockDim.x) {
    float va[N], vb[N];
    load_vec(a + base + c * N, va);
    load_vec(b + base + c * N, vb);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      va[k] = round_as<T>(va[k] + vb[k]);
      sum_sq += va[k] * va[k];
    }
    store_vec(sum + base + c * N, va);
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq) / static_cast<float>(d) + eps);
  for (int64_t c = threadIdx.x; c < vecs; c += blockDim.x) {  // this thread's own sums
    float v[N];
    load_vec(sum + base + c * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k)
      v[k] = (c == threadIdx.x ? first.w[k] : to_float(w[c * N + k])) * (v[k] * inv_rms);
    store_vec(y + base + c * N, v);
  }
}

template <typename T, typename W>
__global__ void layer_norm_vec_kernel(const T* x, const W* w, const W* b, T* y, int64_t d,
                                      float eps, RowIndex gather) {
  constexpr int N = kVec<T>;
  const int64_t vecs = d / N;
  const RowWeights<W, N> first = first_weights<W, N>(w, b, vecs);
  pdl_begin();
  const int64_t row = source_row(gather);
  if (row < 0) return;
  const T* xr = x + row * d;
  T* yr = y + blockIdx.x * d;
  if (vecs <= static_cast<int64_t>(blockDim.x)) {  // one vector a thread (uniform)
    const int64_t c = threadIdx.x;
    float v[N] = {};
    if (c < vecs) load_vec(xr + c * N, v);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) s += v[k];
    const float mean = block_sum(s) / static_cast<float>(d);
    float var = 0.0f;
    if (c < vecs)
#pragma unroll
      for (int k = 0; k < N; ++k) var += (v[k] - mean) * (v[k] - mean);
    const float inv_std = rsqrtf(block_sum(var) / static_cast<float>(d) + eps);
    if (c >= vecs) return;
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = (v[k] - mean) * inv_std * first.w[k] + first.b[k];
    store_vec(yr + c * N, v);
    return;
  }
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < vecs; c += blockDim.x) {
    float v[N];
    load_vec(xr + c * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k) s += v[k];
  }
  const float mean = block_sum(s) / static_cast<float>(d);
  float var = 0.0f;
  for (int64_t c = threadIdx.x; c < vecs; c += blockDim.x) {
    float v[N];
    load_vec(xr + c * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k) var += (v[k] - mean) * (v[k] - mean);
  }
  const float inv_std = rsqrtf(block_sum(var) / static_cast<float>(d) + eps);
  for (int64_t c = threadIdx.x; c < vecs; c += blockDim.x) {
    float v[N];
    load_vec(xr + c * N, v);
    const bool mine = c == threadIdx.x;
#pragma unroll
    for (int k = 0; k < N; ++k)
      v[k] = (v[k] - mean) * inv_std * (mine ? first.w[k] : to_float(w[c * N + k])) +
             (mine ? first.b[k] : to_float(b[c * N + k]));
    store_vec(yr + c * N, v);
  }
}

// Whether rows of d elements of T at these addresses take the vector kernels, and their threads:
// one per vector, in whole warps, at most 1024.
template <typename T>
bool vec_fits(int64_t d, std::initializer_list<const void*> rows) {
  if (d % kVec<T> != 0) return false;
  for (const void* p : rows)
    if (!aligned16(p) || (d * static_cast<int64_t>(sizeof(T))) % 16 != 0) return false;
  return true;
}
template <typename T>
int vec_threads(int64_t d) {
  const int64_t warps = (d / kVec<T> + 31) / 32;
  return static_cast<int>(warps < 32 ? warps * 32 : 1024);
}

template <typename T>
__global__ void softmax_kernel(const T* x, T* y, int64_t d) {
  pdl_begin();
  const T* xr = x + blockIdx.x * d;
  T* yr = y + blockIdx.x * d;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) mx = fmaxf(mx, to_float(xr[i]));
  mx = block_max(mx);
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += expf(to_float(xr[i]) - mx);
  const float inv = 1.0f / block_sum(sum);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    yr[i] = from_float<T>(expf(to_float(xr[i]) - mx) * inv);
}

}  // namespace

void launch_rms_norm(FloatType t, FloatType wt, const void* x, const void* w, void* y, int64_t rows,
                     int64_t d, float eps, KernelStream stream) {
  if (rows == 0) return;
  dispatch_float(t, [&](auto tag) {
    dispatch_float(wt, [&](auto wtag) {
      using T = decltype(tag);
      using W = decltype(wtag);
      if (vec_fits<T>(d, {x, y}))
        launch(rms_norm_vec_kernel<T, W>, static_cast<unsigned>(rows), vec_threads<T>(d), 0, stream,
               static_cast<const T*>(x), static_cast<const W*>(w), static_cast<T*>(y), d, eps);
      else
        launch(rms_norm_kernel<T, W>, static_cast<unsigned>(rows), threads_for(d), 0, stream,
               static_cast<const T*>(x), static_cast<const W*>(w), static_cast<T*>(y), d, eps);
    });
  });
}

void launch_layer_norm(FloatType t, FloatType wt, const void* x, const void* w, const void* b,
                       void* y, int64_t rows, int64_t d, float eps, KernelStream stream,
                       const RowIndex& gather) {
  if (rows == 0) return;
  dispatch_float(t, [&](auto tag) {
    dispatch_float(wt, [&](auto wtag) {
      using T = decltype(tag);
      using W = decltype(wtag);
      if (vec_fits<T>(d, {x, y}))
        launch(layer_norm_vec_kernel<T, W>, static_cast<unsigned>(rows), vec_threads<T>(d), 0,
               stream, static_cast<const T*>(x), static_cast<const W*>(w), static_cast<const W*>(b),
               static_cast<T*>(y), d, eps, gather);
      else
        launch(layer_norm_kernel<T, W>, static_cast<unsigned>(rows), threads_for(d), 0, stream,
               static_cast<const T*>(x), static_cast<const W*>(w), static_cast<const W*>(b),
               static_cast<T*>(y), d, eps, gather);
    });
  });
}

void launch_add_rms_norm(FloatType t, FloatType wt, const void* a, const void* b, const void* w,
                         void* sum, void* y, int64_t rows, int64_t d, float eps,
                         KernelStream stream) {
  if (rows == 0) return;
  dispatch_float(t, [&](auto tag) {
    dispatch_float(wt, [&](auto wtag) {
      using T = decltype(tag);
      using W = decltype(wtag);
      if (vec_fits<T>(d, {a, b, sum, y}))
        launch(add_rms_norm_vec_kernel<T, W>, static_cast<unsigned>(rows), vec_threads<T>(d), 0,
               stream, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<const W*>(w),
               static_cast<T*>(sum), static_cast<T*>(y), d, eps);
      else
        launch(add_rms_norm_kernel<T, W>, static_cast<unsigned>(rows), threads_for(d), 0, stream,
               static_cast<const T*>(a), static_cast<const T*>(b), static_cast<const W*>(w),
               static_cast<T*>(sum), static_cast<T*>(y), d, eps);
    });
  });
}

void launch_softmax(FloatType t, const void* x, void* y, int64_t rows, int64_t d,
                    KernelStream stream) {
  if (rows == 0) return;
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch(softmax_kernel<T>, static_cast<unsigned>(rows), threads_for(d), 0, stream,
           static_cast<const T*>(x), static_cast<T*>(y), d);
  });
}

}  // namespace kiln::cuda
