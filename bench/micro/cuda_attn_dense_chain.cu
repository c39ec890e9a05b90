// Chain benchmark: does a thread-block cluster that attends and then applies the attention's
// output projection (`dense`) to the heads' outputs take a kernel boundary out of bloom-560m's
// batch-1 layer? Each layer of the chain is five dependent steps, as in kiln's decode graph:
// q/k/v GEMV (folded LayerNorm), attention (one block per head over a 128-key cache), dense
// GEMV (+ residual), dense_h_to_4h GEMV (folded LayerNorm, GELU), dense_4h_to_h GEMV (+
// residual); `layers` of them captured in one CUDA graph with programmatic dependent launch.
// The fused variant replaces attention + dense with one kernel launched as a cluster of one
// block per head: each block attends for its head, the cluster exchanges the heads' outputs
// through distributed shared memory, and each block computes hidden / heads rows of dense, its
// weights either prefetched into L2 (mode 0), copied into shared memory (mode 1) or loaded into
// registers (mode 2) before the wait for the q/k/v GEMV. The GEMVs are kiln's (gemv.cu); the
// attention is a reduced copy of attention_warps.cu's (contiguous K/V, no append, no ALiBi).
// Prints each variant's time per layer and its output's largest difference from the unfused.
// Built with kiln when CUDA is found (target kiln_cuda_attn_dense_chain), or alone:
//   nvcc -arch=sm_90 -std=c++17 -O3 -Isrc bench/micro/cuda_attn_dense_chain.cu
//        src/backend/cuda/gemv.cu -o cuda_attn_dense_chain
// Usage: cuda_attn_dense_chain [layers] [replays]. Measured on the H200 (2026-12-02,
// bench/gpu/h200-2026-12-02e-attn-dense-chain.log): 17.1 us a layer today, 20.6 / 20.6 / 18.6
// fused (L2 / shared memory / registers). By nsys, the cluster starts 1.0-1.8 us before the
// q/k/v GEMV ends where the 16 separate blocks start 2.9 us before it, and it holds the chain
// 6.4-8.2 us after that GEMV against 5.2 for attention and dense as two kernels.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cuda/device_types.cuh"

namespace cg = cooperative_groups;
using namespace kiln::cuda;

#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace {

constexpr int kHeads = 16, kDh = 64, kHidden = kHeads * kDh, kFf = 4 * kHidden;
constexpr int kL = 8;                             // lanes per key row: 64 halves in 16-byte loads
constexpr int kGroups = 32 / kL;                  // keys per round
constexpr int kRounds = 4;                        // rounds per warp: 16 keys
constexpr int kW = 8;                             // warps per block: 128 keys
constexpr int kKeys = kW * kGroups * kRounds;     // the cache's 127 keys and this step's one
constexpr int kRowsPerBlock = kHidden / kHeads;   // dense rows per block of the cluster
constexpr int kRowsPerWarp = kRowsPerBlock / kW;  // 8
constexpr int kChunks = kHidden / (8 * 32);       // 16-byte loads per lane per dense row: 4

struct AttnArgs {
  const __half* qkv;  // [3 * hidden]: q | k | v of this step
  const __half* kc;   // [keys - 1, hidden]: the cache
  const __half* vc;
  __half* o;  // [hidden] (unfused)
  // fused
  const __half* wd;  // [hidden, hidden]
  const __half* bias;
  const __half* residual;
  __half* y;
};

__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
  const __half* h = reinterpret_cast<const __half*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = __half2float(h[i]);
}

// Head h's attention output, rounded to half as a store would, into o_s[0, 64). Cache rows are
// loaded before the wait (earlier steps wrote them), q and this step's k / v after.
__device__ void attend(const AttnArgs& a, int h, float* o_s, float* join_s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = lane / kL, sub = lane % kL;
  uint4 kraw[kRounds], vraw[kRounds];
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int key = warp * kGroups * kRounds + r * kGroups + group;
    if (key < kKeys - 1) {
      kraw[r] = __ldg(reinterpret_cast<const uint4*>(a.kc + key * kHidden + h * kDh + sub * 8));
      vraw[r] = __ldg(reinterpret_cast<const uint4*>(a.vc + key * kHidden + h * kDh + sub * 8));
    }
  }
  pdl_wait();
  pdl_trigger();
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int key = warp * kGroups * kRounds + r * kGroups + group;
    if (key == kKeys - 1) {
      kraw[r] = *reinterpret_cast<const uint4*>(a.qkv + kHidden + h * kDh + sub * 8);
      vraw[r] = *reinterpret_cast<const uint4*>(a.qkv + 2 * kHidden + h * kDh + sub * 8);
    }
  }
  float q[8];
  unpack8(*reinterpret_cast<const uint4*>(a.qkv + h * kDh + sub * 8), q);
  float score[kRounds], m = -INFINITY;
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    float kf[8];
    unpack8(kraw[r], kf);
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) dot = fmaf(q[e], kf[e], dot);
#pragma unroll
    for (int o = kL / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    score[r] = dot * 0.125f;
    m = fmaxf(m, score[r]);
  }
#pragma unroll
  for (int o = kL; o < 32; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float l = 0.0f, acc[8] = {};
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const float p = expf(score[r] - m);
    l += p;
    float vf[8];
    unpack8(vraw[r], vf);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = fmaf(p, vf[e], acc[e]);
  }
#pragma unroll
  for (int o = kL; o < 32; o <<= 1) {
    l += __shfl_xor_sync(0xffffffffu, l, o);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
  }
  float* m_s = join_s + kW * kDh;
  float* l_s = m_s + kW;
  if (group == 0) {
#pragma unroll
    for (int e = 0; e < 8; ++e) join_s[warp * kDh + sub * 8 + e] = acc[e];
    if (sub == 0) m_s[warp] = m, l_s[warp] = l;
  }
  __syncthreads();
  if (threadIdx.x < kDh) {
    float mx = -INFINITY;
    for (int w = 0; w < kW; ++w) mx = fmaxf(mx, m_s[w]);
    float sum = 0.0f, v = 0.0f;
    for (int w = 0; w < kW; ++w) {
      const float c = expf(m_s[w] - mx);
      sum += l_s[w] * c;
      v += join_s[w * kDh + threadIdx.x] * c;
    }
    o_s[threadIdx.x] = __half2float(__float2half(v / sum));
  }
}

__global__ void __launch_bounds__(kW * 32) attn_kernel(AttnArgs a) {
  __shared__ float join_s[kW * kDh + 2 * kW];
  __shared__ float o_s[kDh];
  attend(a, blockIdx.x, o_s, join_s);
  if (threadIdx.x < kDh) a.o[blockIdx.x * kDh + threadIdx.x] = __float2half(o_s[threadIdx.x]);
}

template <int kMode>
__global__ void __launch_bounds__(kW * 32, 1) attn_dense_kernel(AttnArgs a) {
  __shared__ float join_s[kW * kDh + 2 * kW];
  __shared__ float o_s[kDh];
  __shared__ float full_s[kHidden];
  extern __shared__ uint4 w_s[];  // mode 1: [kRowsPerBlock][kHidden / 8]
  cg::cluster_group cluster = cg::this_cluster();
  const int h = static_cast<int>(cluster.block_rank());
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = h * kRowsPerBlock + warp * kRowsPerWarp;
  const uint4* wrows =
      reinterpret_cast<const uint4*>(a.wd) + static_cast<int64_t>(row0) * (kHidden / 8);
  uint4 wreg[kMode == 2 ? kRowsPerWarp * kChunks : 1];
  if constexpr (kMode == 0) {
    // This block's rows, one 128-byte line per prefetch.
    const char* base =
        reinterpret_cast<const char*>(a.wd) + static_cast<int64_t>(h * kRowsPerBlock) * kHidden * 2;
    for (int i = threadIdx.x; i < kRowsPerBlock * kHidden * 2 / 128; i += blockDim.x)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(base + static_cast<int64_t>(i) * 128));
  } else if constexpr (kMode == 1) {
    const uint4* src = reinterpret_cast<const uint4*>(a.wd) +
                       static_cast<int64_t>(h * kRowsPerBlock) * (kHidden / 8);
    for (int i = threadIdx.x; i < kRowsPerBlock * kHidden / 8; i += blockDim.x) {
      const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(w_s + i));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src + i));
    }
    asm volatile("cp.async.commit_group;");
  } else {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        wreg[r * kChunks + c] = __ldcs(wrows + r * (kHidden / 8) + c * 32 + lane);
  }
  attend(a, h, o_s, join_s);
  cluster.sync();  // every head's output is in its block's o_s
  for (int i = threadIdx.x; i < kHidden; i += blockDim.x)
    full_s[i] = cluster.map_shared_rank(o_s, i / kDh)[i % kDh];
  if constexpr (kMode == 1) asm volatile("cp.async.wait_all;");
  cluster.sync();  // no block leaves while another still reads its o_s; full_s and w_s ready
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      uint4 w;
      if constexpr (kMode == 0) w = wrows[r * (kHidden / 8) + c * 32 + lane];
      if constexpr (kMode == 1) w = w_s[(warp * kRowsPerWarp + r) * (kHidden / 8) + c * 32 + lane];
      if constexpr (kMode == 2) w = wreg[r * kChunks + c];
      float wf[8];
      unpack8(w, wf);
      const float* x = full_s + (c * 32 + lane) * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) s = fmaf(wf[e], x[e], s);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) {
      const int row = row0 + r;
      // Rounded as kiln's GEMV rounds a fused residual: round(round(y + bias) + residual).
      const float y = __half2float(__float2half(s + __half2float(a.bias[row])));
      a.y[row] = __float2half(y + __half2float(a.residual[row]));
    }
  }
}

__half* upload(const std::vector<float>& v) {
  std::vector<__half> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = __float2half(v[i]);
  __half* d = nullptr;
  CHECK(cudaMalloc(&d, h.size() * sizeof(__half)));
  CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(__half), cudaMemcpyHostToDevice));
  return d;
}

float* row_sums(const std::vector<float>& w, int64_t out, int64_t in) {
  std::vector<float> sums(out, 0.0f);
  for (int64_t f = 0; f < out; ++f)
    for (int64_t i = 0; i < in; ++i) sums[f] += __half2float(__float2half(w[f * in + i]));
  float* d = nullptr;
  CHECK(cudaMalloc(&d, out * sizeof(float)));
  CHECK(cudaMemcpy(d, sums.data(), out * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  const int layers = argc > 1 ? std::atoi(argv[1]) : 24;
  const int replays = argc > 2 ? std::atoi(argv[2]) : 200;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int64_t n, float scale) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng) * scale;
    return v;
  };
  struct Layer {
    __half *wqkv, *bqkv, *wd, *bd, *w1, *b1, *w2, *b2, *kc, *vc;
    float *sqkv, *s1;
  };
  std::vector<Layer> L(layers);
  for (Layer& l : L) {
    const float si = 1.0f / std::sqrt(static_cast<float>(kHidden));
    std::vector<float> wqkv = random(3LL * kHidden * kHidden, si),
                       w1 = random(1LL * kFf * kHidden, si);
    l.wqkv = upload(wqkv);
    l.sqkv = row_sums(wqkv, 3 * kHidden, kHidden);
    l.bqkv = upload(random(3 * kHidden, 0.1f));
    l.wd = upload(random(1LL * kHidden * kHidden, si));
    l.bd = upload(random(kHidden, 0.1f));
    l.w1 = upload(w1);
    l.s1 = row_sums(w1, kFf, kHidden);
    l.b1 = upload(random(kFf, 0.1f));
    l.w2 = upload(random(1LL * kHidden * kFf, 1.0f / std::sqrt(static_cast<float>(kFf))));
    l.b2 = upload(random(kHidden, 0.1f));
    l.kc = upload(random(1LL * (kKeys - 1) * kHidden, 1.0f));
    l.vc = upload(random(1LL * (kKeys - 1) * kHidden, 1.0f));
  }
  __half *x0 = upload(random(kHidden, 1.0f)), *h = nullptr, *h2 = nullptr, *qkv = nullptr,
         *o = nullptr, *ff = nullptr;
  CHECK(cudaMalloc(&h, kHidden * 2));
  CHECK(cudaMalloc(&h2, kHidden * 2));
  CHECK(cudaMalloc(&qkv, 3 * kHidden * 2));
  CHECK(cudaMalloc(&o, kHidden * 2));
  CHECK(cudaMalloc(&ff, kFf * 2));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  KernelStream ks(s, true, nullptr);
  auto gemv = [&](const void* x, const void* w, const void* bias, const void* res, void* y,
                  int64_t in, int64_t out, bool act, const float* sums) {
    GemvParams p{};
    p.type = FloatType::kF16;
    p.x = x;
    p.w = w;
    p.bias_type = FloatType::kF16;
    p.bias = bias;
    p.residual = res;
    p.y = y;
    p.rows = 1;
    p.in = in;
    p.out = out;
    p.split = gemv_split(FloatType::kF16, in, out, sms, 16);
    p.has_act = act;
    p.act = ActFn::kGeluTanh;
    p.norm = sums != nullptr;
    p.norm_row_sums = sums;
    p.norm_eps = 1e-5f;
    if (!launch_gemv(p, ks)) {
      std::fprintf(stderr, "gemv refused %lld -> %lld\n", (long long)in, (long long)out);
      std::exit(1);
    }
  };
  const size_t smem1 = static_cast<size_t>(kRowsPerBlock) * kHidden * 2;
  auto set_attrs = [&](auto kernel, size_t dyn) {
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    if (dyn > 0)
      CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
  };
  set_attrs(attn_dense_kernel<0>, 0);
  set_attrs(attn_dense_kernel<1>, smem1);
  set_attrs(attn_dense_kernel<2>, 0);
  auto fused = [&](int mode, const AttnArgs& a) {
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(kHeads);
    c.blockDim = dim3(kW * 32);
    c.dynamicSmemBytes = mode == 1 ? smem1 : 0;
    c.stream = s;
    cudaLaunchAttribute at[2] = {};
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = kHeads;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = 2;
    if (mode == 0) CHECK(cudaLaunchKernelEx(&c, attn_dense_kernel<0>, a));
    if (mode == 1) CHECK(cudaLaunchKernelEx(&c, attn_dense_kernel<1>, a));
    if (mode == 2) CHECK(cudaLaunchKernelEx(&c, attn_dense_kernel<2>, a));
  };
  for (int mode = 0; mode < 3; ++mode) {
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(kHeads);
    c.blockDim = dim3(kW * 32);
    c.dynamicSmemBytes = mode == 1 ? smem1 : 0;
    cudaLaunchAttribute at[1] = {};
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = kHeads;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    c.attrs = at;
    c.numAttrs = 1;
    int clusters = 0;
    const void* k = mode == 0   ? (const void*)attn_dense_kernel<0>
                    : mode == 1 ? (const void*)attn_dense_kernel<1>
                                : (const void*)attn_dense_kernel<2>;
    CHECK(cudaOccupancyMaxActiveClusters(&clusters, k, &c));
    cudaFuncAttributes fa{};
    CHECK(cudaFuncGetAttributes(&fa, k));
    std::printf("mode %d: %d active clusters of %d possible; %d registers a thread\n", mode,
                clusters, kHeads, fa.numRegs);
  }
  // One pass: h = x0; per layer: qkv = LN(h) Wqkv; o = attn; h2 = o Wd + bd + h;
  // ff = gelu(LN(h2) W1 + b1); h = ff W2 + b2 + h2.
  auto pass = [&](int mode) {  // -1: unfused
    CHECK(cudaMemcpyAsync(h, x0, kHidden * 2, cudaMemcpyDeviceToDevice, s));
    for (const Layer& l : L) {
      gemv(h, l.wqkv, l.bqkv, nullptr, qkv, kHidden, 3 * kHidden, false, l.sqkv);
      AttnArgs a{qkv, l.kc, l.vc, o, l.wd, l.bd, h, h2};
      if (mode < 0) {
        launch(attn_kernel, dim3(kHeads), kW * 32, 0, ks, a);
        gemv(o, l.wd, l.bd, h, h2, kHidden, kHidden, false, nullptr);
      } else {
        fused(mode, a);
      }
      gemv(h2, l.w1, l.b1, nullptr, ff, kHidden, kFf, true, l.s1);
      gemv(ff, l.w2, l.b2, h2, h, kFf, kHidden, false, nullptr);
    }
  };
  std::vector<__half> ref(kHidden), got(kHidden);
  for (int mode = -1; mode < 3; ++mode) {
    pass(mode);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(mode < 0 ? ref.data() : got.data(), h, kHidden * 2, cudaMemcpyDeviceToHost));
    if (mode >= 0) {
      float diff = 0.0f, mx = 0.0f;
      for (int i = 0; i < kHidden; ++i) {
        diff = std::max(diff, std::fabs(__half2float(got[i]) - __half2float(ref[i])));
        mx = std::max(mx, std::fabs(__half2float(ref[i])));
      }
      std::printf("mode %d: largest difference from the unfused chain %.4g (max |h| %.4g)\n", mode,
                  diff, mx);
    }
  }
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  // Interleaved rounds: each variant's graph replayed `replays` times per round.
  cudaGraphExec_t exec[4];
  for (int v = 0; v < 4; ++v) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    pass(v - 1);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&exec[v], g, 0));
    CHECK(cudaGraphDestroy(g));
  }
  const char* names[4] = {"attention + dense GEMV (today)", "fused, dense weights via L2 prefetch",
                          "fused, dense weights in shared memory",
                          "fused, dense weights in registers"};
  std::vector<std::vector<double>> us(4);
  for (int round = 0; round < 5; ++round)
    for (int v = 0; v < 4; ++v) {
      for (int i = 0; i < 10; ++i) CHECK(cudaGraphLaunch(exec[v], s));
      CHECK(cudaEventRecord(e0, s));
      for (int i = 0; i < replays; ++i) CHECK(cudaGraphLaunch(exec[v], s));
      CHECK(cudaEventRecord(e1, s));
      CHECK(cudaEventSynchronize(e1));
      float ms = 0.0f;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      us[v].push_back(1000.0 * ms / replays / layers);
    }
  for (int v = 0; v < 4; ++v) {
    std::sort(us[v].begin(), us[v].end());
    std::printf("%-40s %6.2f us a layer (median of 5 rounds; %.2f-%.2f)\n", names[v],
                us[v][us[v].size() / 2], us[v].front(), us[v].back());
  }
  return 0;
}
