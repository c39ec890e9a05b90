// Linear (x [n, k] · w[m, k]ᵀ) on the CPU at real model sizes: kiln's Linear kernel (tiles below
// 64 rows, oneDNN per pool thread from there) against oneDNN's own OpenMP sgemm on the same
// buffers, for decode (n = 1..16) and prefill (n = 78..1024) shapes. Reports GFLOP/s and, for small
// n, the weight-streaming bandwidth in GB/s; compare with `kiln bench`'s measured read bandwidth.
// Run: build/kiln_linear_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>
#include <random>

#include "backend/cpu/kernels.h"
#include "core/cpu_features.h"

namespace {

using namespace kiln;

struct Problem {
  Tensor x, w, y;
  Node node;
  Problem(int64_t n, int64_t k, int64_t m)
      : x(Tensor::empty(DType::kF32, {n, k})),
        w(Tensor::empty(DType::kF32, {m, k})),
        y(Tensor::empty(DType::kF32, {n, m})) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = u(rng);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = u(rng) * 0.05f;
    node.op = OpKind::kLinear;
    node.name = "bench";
    node.attrs = LinearAttrs{};
  }
};

// KILN_NUM_THREADS threads, like the CLI (default: one per hardware thread).
ThreadPool& pool() {
  static ThreadPool p(std::getenv("KILN_NUM_THREADS") ? std::atoi(std::getenv("KILN_NUM_THREADS"))
                                                      : 0);
  return p;
}

void report(benchmark::State& state, int64_t n, int64_t k, int64_t m) {
  const double flops = 2.0 * n * k * m, bytes = 4.0 * k * m;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_kiln(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1), m = state.range(2);
  Problem p(n, k, m);
  const Tensor in[] = {p.x, p.w};
  Tensor out[] = {p.y};
  const cpu::KernelEnv env{pool(), nullptr};
  const bool avx512 = detect_cpu_features().avx512f;
  for (auto _ : state) {
    if (avx512)
      cpu::linear_avx512(p.node, in, out, env);
    else
      cpu::linear_avx2(p.node, in, out, env);
    benchmark::ClobberMemory();
  }
  report(state, n, k, m);
}

void BM_onednn_sgemm(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1), m = state.range(2);
  Problem p(n, k, m);
  omp_set_num_threads(pool().size());
  for (auto _ : state) {
    dnnl_sgemm('N', 'T', n, m, k, 1.f, p.x.data<float>(), k, p.w.data<float>(), k, 0.f,
               p.y.data<float>(), m);
    benchmark::ClobberMemory();
  }
  report(state, n, k, m);
}

// bloom-560m: hidden 1024 (qkv 3072, ffn 4096); flan-t5-base: d 768, ff 2048.
void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {1, 4, 16, 78, 512}) {
    b->Args({n, 1024, 4096});
    b->Args({n, 4096, 1024});
  }
  b->Args({1, 1024, 250880 / 8});  // a slice of BLOOM's lm_head: streaming, far past the caches
  b->UseRealTime();
}

BENCHMARK(BM_kiln)->Apply(shapes);
BENCHMARK(BM_onednn_sgemm)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
