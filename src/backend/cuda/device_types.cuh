// Device-side helpers shared by the .cu files: element loads and stores for the three float
// types (round to nearest even on store), the activation functions with HuggingFace's formulas,
// dispatch from FloatType to a C++ type, and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/kernels.cuh"

namespace kiln::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// x as T would store it, back in float.
template <typename T>
__device__ __forceinline__ float round_as(float x) {
  return to_float(from_float<T>(x));
}

__device__ __forceinline__ float apply_act(ActFn act, float x) {
  switch (act) {
    case ActFn::kRelu:
      return x > 0.0f ? x : 0.0f;
    case ActFn::kGeluTanh:
      return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case ActFn::kGeluExact:
      return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    case ActFn::kSilu:
      return x / (1.0f + expf(-x));
  }
  return x;
}

// 16 bytes of T as floats, and back (rounded to nearest even): vector kernels do their scalar
// twins' per-element arithmetic, bit for bit, with 16-byte loads and stores.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));
template <typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[kVec<T>]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVec<T>; ++k) out[k] = to_float(e[k]);
}
template <typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[kVec<T>]) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int k = 0; k < kVec<T>; ++k) e[k] = from_float<T>(in[k]);
  *reinterpret_cast<uint4*>(p) = raw;
}
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Calls f(T{}) with the C++ type of t.
template <typename F>
void dispatch_float(FloatType t, F&& f) {
  switch (t) {
    case FloatType::kF32:
      f(float{});
      return;
    case FloatType::kF16:
      f(__half{});
      return;
    case FloatType::kBF16:
      f(__nv_bfloat16{});
      return;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ int warp_sum(int v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of at most 1024 threads (blockDim.x a multiple of 32); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < (blockDim.x >> 5) ? partial[lane] : 0.0f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const float result = total;
  __syncthreads();
  return result;
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < (blockDim.x >> 5) ? partial[lane] : -INFINITY;
    s = warp_max(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  const float result = total;
  __syncthreads();
  return result;
}

// D (16 x 8, fp32) += A (16 x 16, row-major) · B (16 x 8, column-major), fp16 or bf16 operands:
// lane l holds A rows l/4 and l/4 + 8, B column l/4, D rows l/4 and l/4 + 8 at columns
// 2 (l % 4) and 2 (l % 4) + 1 (PTX's m16n8k16 fragment layout).
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Records the first error of a step.
__device__ __forceinline__ void report(DeviceStatus* status, int code, int node, long long value,
                                       long long limit) {
  if (atomicCAS(&status->code, 0, code) == 0) {
    status->node = node;
    status->value = value;
    status->limit = limit;
  }
}

// Row index[r] of a gathered input (RowIndex), or -1 for an index outside [0, table_rows), which
// `reporter` reports as `code` (the first error wins).
__device__ __forceinline__ long long gathered_row(const RowIndex& g, int64_t r, int code,
                                                  bool reporter) {
  const long long id = g.type == IndexType::kI64 ? static_cast<const long long*>(g.index)[r]
                                                 : static_cast<const int*>(g.index)[r];
  if (id >= 0 && id < g.table_rows) return id;
  if (reporter) report(g.status, code, g.node, id, g.table_rows);
  return -1;
}

// Programmatic dependent launch (sm_90 and newer). Kernels go to the stream through launch(),
// which lets a kernel start while the one before it in the stream still runs (when
// KernelStream policy allows it). So every kiln kernel calls pdl_wait() before it reads anything
// an earlier kernel wrote or writes anything an earlier kernel may read (before the wait it may
// only read weights); and pdl_trigger() to let the next kernel's blocks be scheduled (they
// wait in their own pdl_wait() until this grid has finished and its writes are visible). Since
// every kernel waits, a kernel's completion implies the completion of all before it.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Both, for kernels with nothing to do before the wait.
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}

// kernel<<<grid, block, smem, stream>>>(args...), with programmatic dependent launch allowed
// where the stream's policy allows it (KernelStream). A bad launch is left for
// cudaGetLastError, as <<<>>> does.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, KernelStream stream,
            Args&&... args) {
  const bool programmatic =
      stream.programmatic && !(stream.after_library != nullptr && *stream.after_library);
  if (stream.after_library != nullptr) *stream.after_library = false;
  if (stream.launches != nullptr) ++*stream.launches;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream.stream;
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = programmatic ? 1 : 0;
  (void)cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

}  // namespace kiln::cuda
