// Linear (x [n, k] · w[m, k]ᵀ) on the CPU at real model sizes: kiln's Linear kernel (on AVX-512
// the packed register-blocked kernel for every n; AVX2: tiles below 64 rows, oneDNN from there)
// against oneDNN's own OpenMP sgemm on the same
// buffers, for decode (n = 1..16) and prefill (n = 78..1024) shapes. Reports GFLOP/s and, for small
// n, the weight-streaming bandwidth in GB/s; compare with `kiln bench`'s measured read bandwidth.
// Also flan-t5-base's prompt shapes (78 rows) in int8 dot products, hot and with the weights cold
// (BM_kiln_int8_cold), against oneDNN's u8 x s8 matmul as `kiln bench` times it.
// Run: build/kiln_linear_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>
#include <random>
#include <string>

#include "backend/cpu/kernels.h"
#include "backend/cpu/onednn_reference.h"
#include "core/cpu_features.h"
#include "core/dtype.h"

namespace {

using namespace kiln;

// x [n, k] f32, w [m, k] of `wt` (random values of sensible scale; i8 with unit scales), as
// the one-node graph the kernel is prepared from.
struct Problem {
  Tensor x, w, y, scales, input_scale;
  Graph graph;
  Problem(int64_t n, int64_t k, int64_t m, DType wt = DType::kF32)
      : x(Tensor::empty(DType::kF32, {n, k})),
        w(Tensor::empty(DType::kF32, {m, k})),
        y(Tensor::empty(DType::kF32, {n, m})) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = u(rng);
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = u(rng) * 0.05f;
    if (wt == DType::kI8) {
      Tensor q = Tensor::empty(DType::kI8, {m, k});
      for (int64_t i = 0; i < w.numel(); ++i)
        q.data<int8_t>()[i] = static_cast<int8_t>(w.data<float>()[i] * 2000);
      w = q;
      scales = Tensor::empty(DType::kF32, {m});
      for (int64_t i = 0; i < m; ++i) scales.data<float>()[i] = 1.f;
    } else if (wt != DType::kF32) {
      Tensor h = Tensor::empty(wt, {m, k});
      dtype_traits(wt).from_float(w.data<float>(), h.raw(), static_cast<size_t>(w.numel()));
      w = h;
    }
    graph.values.resize(5);
    graph.values[0] = Value{"x", DType::kF32, {Dim::sym("tokens"), Dim::of(k)}};
    graph.values[1] = Value{"w", wt, {Dim::of(m), Dim::of(k)}, ValueKind::kWeight, -1, w};
    graph.values[2] = Value{"y", DType::kF32, {Dim::sym("tokens"), Dim::of(m)}};
    graph.values[3] = Value{"scales", DType::kF32, {Dim::of(m)}, ValueKind::kWeight, -1, scales};
    // W8A8's static input scale: x in [-1, 1) quantized to ±127 levels.
    input_scale = Tensor::from_vector<float>({1.f / 127.f}, {1});
    graph.values[4] =
        Value{"x.scale", DType::kF32, {Dim::of(1)}, ValueKind::kWeight, -1, input_scale};
    Node node;
    node.op = OpKind::kLinear;
    node.name = "bench";
    node.attrs = LinearAttrs{};
    node.inputs = {0, 1, -1};
    if (wt == DType::kI8) node.inputs.push_back(3);
    node.outputs = {2};
    graph.nodes.push_back(node);
  }
};

// KILN_NUM_THREADS threads, like the CLI (default: one per hardware thread).
ThreadPool& pool() {
  static ThreadPool p(std::getenv("KILN_NUM_THREADS") ? std::atoi(std::getenv("KILN_NUM_THREADS"))
                                                      : 0);
  return p;
}

void report(benchmark::State& state, int64_t n, int64_t k, int64_t m, size_t elem = 4) {
  const double flops = 2.0 * n * k * m, bytes = static_cast<double>(elem) * k * m;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}

// kiln's Linear as the CPU backend runs it: the AVX-512 kernel over panel16-packed weights
// (packed once, when prepared), or the AVX2 tiles. range(3): 0 f32, 1 bf16, 2 i8 weights, 3 bf16
// weights in AVX512-BF16 dot products, 4 i8 weights in AVX512-VNNI dot products, 5 W8A8 (i8
// weights, int8 inputs with a static scale: --precision int8) in AVX512-VNNI dot products.
void BM_kiln(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1), m = state.range(2);
  const DType wt = state.range(3) == 0 ? DType::kF32
                   : state.range(3) == 2 || state.range(3) == 4 || state.range(3) == 5
                       ? DType::kI8
                       : DType::kBF16;
  Problem p(n, k, m, wt);
  const bool w8a8 = state.range(3) == 5;
  if (w8a8) {
    p.graph.nodes[0].inputs.resize(slot(LinearOperand::kInputScale) + 1, -1);
    p.graph.nodes[0].inputs[slot(LinearOperand::kInputScale)] = 4;
  }
  const Node& node = p.graph.nodes[0];
  // KILN_CPU_ISA=avx2 times the AVX2 family's kernels on an AVX-512 machine too.
  const char* isa = std::getenv("KILN_CPU_ISA");
  const bool avx512 = detect_cpu_features().avx512f && !(isa && std::string(isa) == "avx2");
  const bool dot = state.range(3) == 3, int8_dot = state.range(3) == 4 || w8a8;
  if (dot && !detect_cpu_features().avx512_bf16) {
    state.SkipWithError("no AVX512-BF16 here");
    return;
  }
  if (int8_dot && !(detect_cpu_features().avx512_vnni && detect_cpu_features().avx512_vbmi)) {
    state.SkipWithError("no AVX512-VNNI and AVX512-VBMI here");
    return;
  }
  std::unique_ptr<Kernel> kernel = dot        ? cpu::packed_bf16_dot_linear_factory()(node)
                                   : w8a8     ? cpu::packed_w8a8_vnni_linear_factory()(node)
                                   : int8_dot ? cpu::packed_int8_dot_linear_factory()(node)
                                   : avx512   ? cpu::packed_linear_factory(wt)(node)
                                              : nullptr;
  if (kernel) kernel->prepare(p.graph);
  const Tensor in[] = {p.x,      p.w,      Tensor(), p.scales,     Tensor(),
                       Tensor(), Tensor(), Tensor(), p.input_scale};
  Tensor out[] = {p.y};
  const std::span<const Tensor> inputs(in, w8a8 ? 9 : wt == DType::kI8 ? 4 : 2);
  const cpu::KernelEnv env{pool(), nullptr};
  for (auto _ : state) {
    if (kernel)
      kernel->run(KernelArgs{inputs, out, nullptr, nullptr, &pool()});
    else if (wt == DType::kI8)
      cpu::linear_i8_avx2(node, inputs, out, env);
    else if (wt == DType::kBF16)
      cpu::linear_bf16_avx2(node, inputs, out, env);
    else
      cpu::linear_avx2(node, inputs, out, env);
    benchmark::ClobberMemory();
  }
  report(state, n, k, m, dtype_bytes(wt, 1));
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
    b->Args({n, 1024, 4096, 0});
    b->Args({n, 4096, 1024, 0});
  }
  b->Args({1, 1024, 250880 / 8, 0});  // a slice of BLOOM's lm_head: streaming, far past the caches
  b->UseRealTime();
}

void narrow_shapes(benchmark::internal::Benchmark* b) {
  for (int64_t wt : {0, 1, 2, 3, 4}) {
    for (int64_t n : {1, 16, 78}) b->Args({n, 1024, 4096, wt});
    for (int64_t n : {1, 16}) b->Args({n, 1024, 250880 / 4, wt});  // past the caches
  }
  b->UseRealTime();
}

// The same int8 dot-product Linear with its weights cold, as in a model's prompt step: calls
// rotate over copies of the problem whose weights add up to ~96 MB, past the last-level cache.
void BM_kiln_int8_cold(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1), m = state.range(2);
  if (!(detect_cpu_features().avx512_vnni && detect_cpu_features().avx512_vbmi)) {
    state.SkipWithError("no AVX512-VNNI and AVX512-VBMI here");
    return;
  }
  const int64_t copies = std::max<int64_t>(2, (96 << 20) / (k * m));
  std::vector<std::unique_ptr<Problem>> problems;
  std::vector<std::unique_ptr<Kernel>> kernels;
  for (int64_t c = 0; c < copies; ++c) {
    problems.push_back(std::make_unique<Problem>(n, k, m, DType::kI8));
    kernels.push_back(cpu::packed_int8_dot_linear_factory()(problems.back()->graph.nodes[0]));
    kernels.back()->prepare(problems.back()->graph);
  }
  int64_t c = 0;
  for (auto _ : state) {
    Problem& p = *problems[c];
    const Tensor in[] = {p.x, p.w, Tensor(), p.scales};
    Tensor out[] = {p.y};
    kernels[c]->run(KernelArgs{std::span<const Tensor>(in, 4), out, nullptr, nullptr, &pool()});
    benchmark::ClobberMemory();
    c = (c + 1) % copies;
  }
  report(state, n, k, m, 1);
}

// oneDNN's matmul primitive as `kiln bench` times it (weights reordered once into its layout):
// range(3) 0 f32, 1 bf16, 2 u8 x s8.
void BM_onednn_matmul(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1), m = state.range(2);
  const LibraryGemmType type = state.range(3) == 0   ? LibraryGemmType::kF32
                               : state.range(3) == 1 ? LibraryGemmType::kBf16
                                                     : LibraryGemmType::kInt8;
  for (auto _ : state) {
    const std::optional<LibraryGemmTiming> t =
        cpu::time_onednn_matmul(n, k, m, type, static_cast<int>(pool().size()), 5);
    if (!t) {
      state.SkipWithError("oneDNN has no implementation of this GEMM on this CPU");
      break;
    }
    state.SetIterationTime(t->ms / 1000.0);
    state.SetLabel(t->impl);
  }
  report(state, n, k, m, 1);
}

// flan-t5-base's prompt step (78 rows): d 768, stacked q/k/v 2304, ff 2048, and back.
void t5_prefill_shapes(benchmark::internal::Benchmark* b, int64_t type) {
  for (auto [k, m] : {std::pair<int64_t, int64_t>{768, 768}, {768, 2304}, {768, 2048}, {2048, 768}})
    b->Args({78, k, m, type});
}

BENCHMARK(BM_kiln)->Apply(shapes);
BENCHMARK(BM_kiln)->Apply([](benchmark::internal::Benchmark* b) {
  t5_prefill_shapes(b, 4);
  b->UseRealTime();
});
BENCHMARK(BM_kiln_int8_cold)->Apply([](benchmark::internal::Benchmark* b) {
  t5_prefill_shapes(b, 4);
  b->UseRealTime();
});
BENCHMARK(BM_onednn_matmul)->Apply([](benchmark::internal::Benchmark* b) {
  t5_prefill_shapes(b, 2);
  b->UseManualTime();
});
BENCHMARK(BM_kiln)->Apply(narrow_shapes);
// W8A8 against the bf16 dot products (the plans --precision int8 and bf16 run) at bloom-560m's
// and flan-t5-base's prefill shapes: 512 prompt rows.
BENCHMARK(BM_kiln)->Apply([](benchmark::internal::Benchmark* b) {
  for (int64_t type : {3, 5})
    for (auto [k, m] : {std::pair<int64_t, int64_t>{1024, 3072},
                        {1024, 1024},
                        {1024, 4096},
                        {4096, 1024},
                        {768, 2304},
                        {2048, 768}})
      b->Args({512, k, m, type});
  b->UseRealTime();
});
BENCHMARK(BM_onednn_sgemm)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
