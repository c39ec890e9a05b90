// Elementwise and row-copy kernels: embedding, gather rows, batched buffer copies, add/mul/scale,
// cast, activations (plain, gated, and the bias + activation that follows a cuBLASLt GEMM). Every
// element is computed in fp32 from its own inputs and rounded once, to nearest even, into the
// output type.
#include <algorithm>

#include "backend/cuda/device_types.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

template <typename I>
__device__ __forceinline__ long long index_at(const void* p, int64_t i) {
  return static_cast<long long>(static_cast<const I*>(p)[i]);
}

// Block b copies part b (blocks beyond 65535 parts loop): 16-byte chunks where the part allows.
__global__ void copy_parts_kernel(const CopyPart* parts, int64_t count) {
  pdl_begin();
  for (int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const CopyPart c = parts[i];
    const uintptr_t bits = reinterpret_cast<uintptr_t>(c.src) | reinterpret_cast<uintptr_t>(c.dst) |
                           static_cast<uintptr_t>(c.bytes);
    if ((bits & 15) == 0) {
      const uint4* src = static_cast<const uint4*>(c.src);
      uint4* dst = static_cast<uint4*>(c.dst);
      for (long long j = threadIdx.x; j < c.bytes / 16; j += blockDim.x) dst[j] = src[j];
    } else {
      const unsigned char* src = static_cast<const unsigned char*>(c.src);
      unsigned char* dst = static_cast<unsigned char*>(c.dst);
      for (long long j = threadIdx.x; j < c.bytes; j += blockDim.x) dst[j] = src[j];
    }
  }
}

// Block (b, i) copies units b * blockDim.x + threadIdx.x, then a grid's worth further on, ... of
// part i: 16 bytes where source and destination are 16-byte aligned, then the last bytes singly
// (all singly otherwise). A host part's first unit is loaded before the wait (.cv: never a
// cached line, the host rewrites these buffers between steps), so that a thread's read across
// the bus overlaps the kernel before this one.
struct UploadUnit {
  uint4 wide;
  unsigned char byte;
};

__global__ void uploads_kernel(UploadList list) {
  const UploadPart p = list.part[blockIdx.y];
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(p.src) | reinterpret_cast<uintptr_t>(p.dst)) & 15) == 0;
  const long long wide = aligned ? p.bytes / 16 : 0;  // units 0 .. wide - 1: 16 bytes each
  const long long units = wide + (p.bytes - wide * 16);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto* src = static_cast<const unsigned char*>(p.src);
  auto* dst = static_cast<unsigned char*>(p.dst);
  auto load = [&](long long j) {
    UploadUnit u{};
    const unsigned char* at = j < wide ? src + j * 16 : src + wide * 16 + (j - wide);
    if (j < wide)
      u.wide =
          p.host ? __ldcv(reinterpret_cast<const uint4*>(at)) : *reinterpret_cast<const uint4*>(at);
    else
      u.byte = p.host ? __ldcv(at) : *at;
    return u;
  };
  UploadUnit u{};
  if (p.host && first < units) u = load(first);
  pdl_wait();
  pdl_trigger();
  for (long long j = first; j < units; j += stride) {
    if (j != first || !p.host) u = load(j);
    if (j < wide)
      *reinterpret_cast<uint4*>(dst + j * 16) = u.wide;
    else
      dst[wide * 16 + (j - wide)] = u.byte;
  }
}

__global__ void publish_status_kernel(const DeviceStatus* status, DeviceStatus* host) {
  pdl_begin();
  if (threadIdx.x == 0) *host = *status;
}

// One block per output row; the rows are plain copies of table rows.
template <typename T, typename I>
__global__ void copy_rows_kernel(const T* src, int64_t src_rows, int64_t d, const void* index,
                                 T* out, DeviceStatus* status, int code, int node) {
  pdl_begin();
  const int64_t r = blockIdx.x;
  const long long id = index_at<I>(index, r);
  if (id < 0 || id >= src_rows) {
    if (threadIdx.x == 0) report(status, code, node, id, src_rows);
    return;
  }
  const T* s = src + id * d;
  T* o = out + r * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = s[c];
}

template <typename T>
void copy_rows(const void* src, int64_t src_rows, int64_t d, IndexType it, const void* index,
               int64_t n, void* out, DeviceStatus* status, int code, int node, KernelStream s) {
  if (n == 0) return;
  const int threads = d >= 256 ? 256 : 64;
  if (it == IndexType::kI64)
    launch(copy_rows_kernel<T, long long>, static_cast<unsigned>(n), threads, 0, s,
           static_cast<const T*>(src), src_rows, d, index, static_cast<T*>(out), status, code,
           node);
  else
    launch(copy_rows_kernel<T, int>, static_cast<unsigned>(n), threads, 0, s,
           static_cast<const T*>(src), src_rows, d, index, static_cast<T*>(out), status, code,
           node);
}

// One block per output row: table row ids[r] (int8) times its scale, as f32.
template <typename I>
__global__ void embedding_i8_kernel(const int8_t* table, const float* scales, int64_t vocab,
                                    int64_t d, const void* ids, float* out, DeviceStatus* status,
                                    int node) {
  pdl_begin();
  const int64_t r = blockIdx.x;
  const long long id = index_at<I>(ids, r);
  if (id < 0 || id >= vocab) {
    if (threadIdx.x == 0) report(status, kStatusTokenId, node, id, vocab);
    return;
  }
  const int8_t* s = table + id * d;
  const float scale = scales[id];
  float* o = out + r * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = static_cast<float>(s[c]) * scale;
}

template <typename T>
__global__ void binary_kernel(BinaryOp op, const T* a, const T* b, T* y, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float x = to_float(a[i]), z = to_float(b[i]);
    y[i] = from_float<T>(op == BinaryOp::kAdd ? x + z : x * z);
  }
}

template <typename T>
__global__ void scale_kernel(const T* x, float s, T* y, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(to_float(x[i]) * s);
}

template <typename From, typename To>
__global__ void cast_kernel(const From* x, To* y, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<To>(to_float(x[i]));
}

// Eight elements a thread in 16-byte loads and stores (both buffers 16-byte aligned): the
// logits' fp16/bf16 -> fp32 cast of a batched decode step reads 32 MB.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  constexpr int kN = kVec<T>;
#pragma unroll
  for (int part = 0; part < 8 / kN; ++part) {
    float a[kN];
    load_vec<T>(p + part * kN, a);
#pragma unroll
    for (int k = 0; k < kN; ++k) v[part * kN + k] = a[k];
  }
}
template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&v)[8]) {
  constexpr int kN = kVec<T>;
#pragma unroll
  for (int part = 0; part < 8 / kN; ++part) {
    float a[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) a[k] = v[part * kN + k];
    store_vec<T>(p + part * kN, a);
  }
}
template <typename From, typename To>
__global__ void cast8_kernel(const From* x, To* y, int64_t groups) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < groups;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v[8];
    load8(x + 8 * i, v);
    store8(y + 8 * i, v);
  }
}

template <typename T>
__global__ void activation_kernel(ActFn act, const T* x, T* y, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(apply_act(act, to_float(x[i])));
}

template <typename T, typename B>
__global__ void bias_activation_kernel(T* y, const B* bias, int64_t rows, int64_t cols,
                                       bool has_act, ActFn act) {
  pdl_begin();
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = to_float(y[i]);
    if (bias != nullptr) v = round_as<T>(v + to_float(bias[i % cols]));
    if (has_act) v = apply_act(act, v);
    y[i] = from_float<T>(v);
  }
}

// bias_activation_kernel on rows whose length is a whole number of vectors.
template <typename T, typename B>
__global__ void bias_activation_vec_kernel(T* y, const B* bias, int64_t rows, int64_t cols,
                                           bool has_act, ActFn act) {
  constexpr int N = kVec<T>;
  pdl_begin();
  const int64_t vecs = rows * cols / N;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vecs;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c0 = v * N % cols;
    float x[N];
    load_vec(y + v * N, x);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (bias != nullptr) x[k] = round_as<T>(x[k] + to_float(bias[c0 + k]));
      if (has_act) x[k] = apply_act(act, x[k]);
    }
    store_vec(y + v * N, x);
  }
}

// y [rows, cols] = act(gate) * up, gate's and up's rows `ld` elements apart (cols for two
// inputs, 2 * cols for a packed gate | up).
template <typename T>
__global__ void gated_vec_kernel(ActFn act, const T* gate, const T* up, T* y, int64_t vecs,
                                 int64_t row_vecs, int64_t ld) {
  constexpr int N = kVec<T>;
  pdl_begin();
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vecs;
       v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = v / row_vecs, at = r * ld + (v - r * row_vecs) * N;
    float g[N], u[N];
    load_vec(gate + at, g);
    load_vec(up + at, u);
#pragma unroll
    for (int k = 0; k < N; ++k) g[k] = round_as<T>(apply_act(act, g[k])) * u[k];
    store_vec(y + v * N, g);
  }
}

template <typename T>
__global__ void gated_kernel(ActFn act, const T* gate, const T* up, T* y, int64_t n, int64_t cols,
                             int64_t ld) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, at = r * ld + (i - r * cols);
    y[i] = from_float<T>(round_as<T>(apply_act(act, to_float(gate[at]))) * to_float(up[at]));
  }
}

}  // namespace

void launch_embedding(FloatType t, const void* table, int64_t vocab, int64_t d, IndexType it,
                      const void* ids, int64_t n, void* out, DeviceStatus* status, int node,
                      KernelStream stream) {
  dispatch_float(t, [&](auto tag) {
    copy_rows<decltype(tag)>(table, vocab, d, it, ids, n, out, status, kStatusTokenId, node,
                             stream);
  });
}

void launch_embedding_i8(const int8_t* table, const float* scales, int64_t vocab, int64_t d,
                         IndexType it, const void* ids, int64_t n, float* out, DeviceStatus* status,
                         int node, KernelStream stream) {
  if (n == 0) return;
  const int threads = d >= 256 ? 256 : 64;
  if (it == IndexType::kI64)
    launch(embedding_i8_kernel<long long>, static_cast<unsigned>(n), threads, 0, stream, table,
           scales, vocab, d, ids, out, status, node);
  else
    launch(embedding_i8_kernel<int>, static_cast<unsigned>(n), threads, 0, stream, table, scales,
           vocab, d, ids, out, status, node);
}

void launch_gather_rows(FloatType t, const void* x, int64_t rows_in, int64_t d, IndexType it,
                        const void* rows, int64_t r, void* out, DeviceStatus* status, int node,
                        KernelStream stream) {
  dispatch_float(t, [&](auto tag) {
    copy_rows<decltype(tag)>(x, rows_in, d, it, rows, r, out, status, kStatusGatherRow, node,
                             stream);
  });
}

void launch_binary(BinaryOp op, FloatType t, const void* a, const void* b, void* y, int64_t n,
                   KernelStream stream) {
  if (n == 0) return;
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch(binary_kernel<T>, grid_for(n, kThreads), kThreads, 0, stream, op,
           static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n);
  });
}

void launch_scale(FloatType t, const void* x, float s, void* y, int64_t n, KernelStream stream) {
  if (n == 0) return;
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch(scale_kernel<T>, grid_for(n, kThreads), kThreads, 0, stream, static_cast<const T*>(x), s,
           static_cast<T*>(y), n);
  });
}

void launch_copy_parts(const CopyPart* parts, int64_t count, KernelStream stream) {
  if (count == 0) return;
  launch(copy_parts_kernel, dim3(static_cast<unsigned>(count < 65535 ? count : 65535)), kThreads, 0,
         stream, parts, count);
}

void launch_uploads(const UploadList& list, KernelStream stream) {
  long long most = 0;  // units of the largest part (16-byte ones, then single bytes)
  for (int i = 0; i < list.count; ++i)
    most = std::max(most, list.part[i].bytes / 16 + list.part[i].bytes % 16);
  if (most == 0) return;
  const long long blocks = std::min<long long>((most + kThreads - 1) / kThreads, 64);
  launch(uploads_kernel, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(list.count)),
         kThreads, 0, stream, list);
}

void launch_publish_status(const DeviceStatus* status, DeviceStatus* host, KernelStream stream) {
  launch(publish_status_kernel, 1, 32, 0, stream, status, host);
}

void launch_cast(FloatType from, FloatType to, const void* x, void* y, int64_t n,
                 KernelStream stream) {
  if (n == 0) return;
  dispatch_float(from, [&](auto from_tag) {
    dispatch_float(to, [&](auto to_tag) {
      using F = decltype(from_tag);
      using T = decltype(to_tag);
      const int64_t groups = aligned16(x) && aligned16(y) ? n / 8 : 0;
      if (groups > 0)
        launch(cast8_kernel<F, T>, grid_for(groups, kThreads), kThreads, 0, stream,
               static_cast<const F*>(x), static_cast<T*>(y), groups);
      if (n > groups * 8)
        launch(cast_kernel<F, T>, grid_for(n - groups * 8, kThreads), kThreads, 0, stream,
               static_cast<const F*>(x) + groups * 8, static_cast<T*>(y) + groups * 8,
               n - groups * 8);
    });
  });
}

void launch_activation(ActFn act, FloatType t, const void* x, void* y, int64_t n,
                       KernelStream stream) {
  if (n == 0) return;
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    launch(activation_kernel<T>, grid_for(n, kThreads), kThreads, 0, stream, act,
           static_cast<const T*>(x), static_cast<T*>(y), n);
  });
}

void launch_bias_activation(FloatType t, void* y, FloatType bias_t, const void* bias, int64_t rows,
                            int64_t cols, bool has_act, ActFn act, KernelStream stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  dispatch_float(t, [&](auto tag) {
    dispatch_float(bias_t, [&](auto bias_tag) {
      using T = decltype(tag);
      using B = decltype(bias_tag);
      if (cols % kVec<T> == 0 && aligned16(y))
        launch(bias_activation_vec_kernel<T, B>, grid_for(n / kVec<T>, kThreads), kThreads, 0,
               stream, static_cast<T*>(y), static_cast<const B*>(bias), rows, cols, has_act, act);
      else
        launch(bias_activation_kernel<T, B>, grid_for(n, kThreads), kThreads, 0, stream,
               static_cast<T*>(y), static_cast<const B*>(bias), rows, cols, has_act, act);
    });
  });
}

void launch_gated(ActFn act, FloatType t, const void* gate, const void* up, void* y, int64_t rows,
                  int64_t cols, int64_t ld, KernelStream stream) {
  const int64_t n = rows * cols;
  if (n == 0) return;
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    if (cols % kVec<T> == 0 && ld % kVec<T> == 0 && aligned16(gate) && aligned16(up) &&
        aligned16(y))
      launch(gated_vec_kernel<T>, grid_for(n / kVec<T>, kThreads), kThreads, 0, stream, act,
             static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(y),
             n / kVec<T>, cols / kVec<T>, ld);
    else
      launch(gated_kernel<T>, grid_for(n, kThreads), kThreads, 0, stream, act,
             static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(y), n, cols,
             ld);
  });
}

}  // namespace kiln::cuda
