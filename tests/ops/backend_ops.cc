// The op harness's machinery: backends under test, data, running scenarios, comparisons.
#include "backend_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "../models/graph_runner.h"
#include "../scoped_env.h"
#include "backend/reference/reference_backend.h"
#include "f16_reference.h"

namespace kiln::test {

std::vector<NamedBackend> available_backends() {
  std::vector<NamedBackend> out;
  const CpuFeatures features = detect_cpu_features();
  const bool has_avx512 = best_cpu_isa(features) == CpuIsa::kAvx512;
  // AVX-512 runs again where the CPU has AVX512-BF16 (bf16 weights in bf16 dot products:
  // kBf16DotBackend) and where it has AVX512-VNNI and VBMI (i8 weights in int8 dot products:
  // kInt8DotBackend); the plain avx512 family keeps f32 FMAs for both.
  for (int family = 0; family < 4; ++family) {
    const CpuIsa isa = family == 0 ? CpuIsa::kAvx2 : CpuIsa::kAvx512;
    const bool bf16_dot = family == 2, int8_dot = family == 3;
    if (isa == CpuIsa::kAvx512 && !has_avx512) continue;
    if (bf16_dot && !features.avx512_bf16) continue;
    if (int8_dot && !(features.avx512_vnni && features.avx512_vbmi)) continue;
    // Three threads so that work splits unevenly across the pool.
    ContextOptions options{LogLevel::kError, 3};
    options.cpu_isa = isa;
    options.cpu_bf16_dot = bf16_dot;
    options.cpu_int8_dot = int8_dot;
    auto ctx = std::make_unique<Context>(options);
    auto backend = make_cpu_backend(*ctx);
    const std::string name = bf16_dot   ? std::string(kBf16DotBackend)
                             : int8_dot ? std::string(kInt8DotBackend)
                                        : fmt::format("cpu-{}", cpu_isa_name(isa));
    out.push_back({name, std::move(ctx), std::move(backend), /*batch_invariant=*/true});
  }
  // cuBLASLt picks its algorithm per shape, so CUDA does not promise batch invariance.
  if (query_cuda().device_count > 0) {
    auto ctx = std::make_unique<Context>(ContextOptions{LogLevel::kError, 1});
    auto backend = make_cuda_backend(*ctx);
    out.push_back({"cuda", std::move(ctx), std::move(backend), /*batch_invariant=*/false});
    // Again with attention.cu's row kernel where the warp kernel would take the step, kiln's
    // GEMV for every Linear of up to 8 rows (tuned plans may choose it there; without a tactic
    // it takes up to 5 rows) and cuBLASLt for every Linear of more (the skinny GEMM's rows
    // included); W8A8 and fp8 Linears on their GEMV's slices up to 32 rows (default 8).
    {
      const ScopedEnv block_rows("KILN_CUDA_WARP_ATTN", "0"), gemv_rows("KILN_CUDA_GEMV_ROWS", "8"),
          skinny_rows("KILN_CUDA_SKINNY_ROWS", "0"), w8a8_rows("KILN_CUDA_W8A8_GEMV_ROWS", "32");
      auto block_ctx = std::make_unique<Context>(ContextOptions{LogLevel::kError, 1});
      auto backend = make_cuda_backend(*block_ctx);
      out.push_back({"cuda-block-attention", std::move(block_ctx), std::move(backend),
                     /*batch_invariant=*/false});
    }
    // Again with the wide one-row GEMV for every one-row Linear (by default only a Linear run
    // right after another one whose wide grid fills half the SMs: larger than these cases).
    {
      const ScopedEnv wide("KILN_CUDA_GEMV_WIDE", "2");
      auto wide_ctx = std::make_unique<Context>(ContextOptions{LogLevel::kError, 1});
      auto backend = make_cuda_backend(*wide_ctx);
      out.push_back({"cuda-wide", std::move(wide_ctx), std::move(backend),
                     /*batch_invariant=*/false});
    }
    // Again without CUDA graphs: every step launched kernel by kernel, so that an op graph's
    // first kernel runs right behind the step's uploads kernel under programmatic launch (the
    // warp attention once read the step's layout before its wait there and met a half-written
    // block table: "KV block -1", every time without graphs, now and then with them).
    {
      const ScopedEnv eager("KILN_CUDA_GRAPHS", "0");
      auto eager_ctx = std::make_unique<Context>(ContextOptions{LogLevel::kError, 1});
      auto backend = make_cuda_backend(*eager_ctx);
      out.push_back({"cuda-eager", std::move(eager_ctx), std::move(backend),
                     /*batch_invariant=*/false});
    }
    // Again with the tensor-core attention for every step it can take, in blocks of 64 and of
    // 32 query rows (by default only prompts that fill the GPU take it, larger than these cases).
    for (const char* rows : {"64", "32"}) {
      const ScopedEnv tiled("KILN_CUDA_TILED", "always"), tiled_rows("KILN_CUDA_TILED_ROWS", rows);
      auto tiled_ctx = std::make_unique<Context>(ContextOptions{LogLevel::kError, 1});
      auto backend = make_cuda_backend(*tiled_ctx);
      out.push_back({fmt::format("cuda-tiled-attention-{}", rows), std::move(tiled_ctx),
                     std::move(backend), /*batch_invariant=*/false});
    }
  }
  return out;
}

std::unique_ptr<Backend> reference_backend() {
  // The reference backend only logs through its context; one per process is enough.
  static Context ctx(ContextOptions{LogLevel::kError, 1});
  return make_reference_backend(ctx);
}

std::vector<NamedBackend> every_backend() {
  std::vector<NamedBackend> all = available_backends();
  all.push_back({"reference", nullptr, reference_backend()});
  return all;
}

float round_value(DType dtype, float f) {
  switch (dtype) {
    case DType::kF32:
      return f;
    case DType::kF16:
      return static_cast<float>(f16_value(f16_bits(f)));
    case DType::kBF16:
      return static_cast<float>(bf16_value(bf16_bits(f)));
    case DType::kI8:
    case DType::kI32:
    case DType::kI64:
    case DType::kF8E4M3:  // no op case runs in fp8 yet
    case DType::kF8E5M2:
    case DType::kI4:
      break;
  }
  KILN_FAIL("round_value: the op cases run in f32, f16 or bf16, not {}", dtype_name(dtype));
}

Int4Weight int4_weight(Gen& g, int64_t out, int64_t in) {
  const std::vector<float> v = g.floats(out * in, -8.49f, 7.49f);
  std::vector<float> q(v.size());
  for (size_t i = 0; i < v.size(); ++i) q[i] = std::nearbyint(v[i]);
  q.front() = -8.0f;
  q.back() = 7.0f;
  Tensor qt = Tensor::empty(DType::kI4, {out, in});
  dtype_traits(DType::kI4).from_float(q.data(), qt.raw(), q.size());
  std::vector<float> s = g.floats(out * int4_groups(in), 0.001f, 0.05f);
  for (size_t i = 0; i < s.size(); i += 3) s[i] = -s[i];
  return {qt, make_tensor(DType::kF16, s, {out, int4_groups(in)})};
}

Tensor quantize_rows_to_int8(const Tensor& x) {
  constexpr int64_t kGroup = 128;
  Tensor r = x.clone();
  const int64_t k = x.dim(x.rank() - 1), n = x.numel() / k;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t g0 = 0; g0 < k; g0 += kGroup) {
      float* group = r.data<float>() + t * k + g0;
      const int64_t len = std::min(kGroup, k - g0);
      float amax = 0.f;
      for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(group[i]));
      const float inv = amax > 0.f ? 127.f / amax : 0.f, scale = amax / 127.f;
      for (int64_t i = 0; i < len; ++i) group[i] = std::nearbyint(group[i] * inv) * scale;
    }
  return r;
}

Tensor make_tensor(DType dtype, const std::vector<float>& v, const Shape& shape) {
  if (dtype == DType::kF32) return Tensor::from_vector(v, shape);
  Tensor t = Tensor::empty(dtype, shape);
  KILN_CHECK(static_cast<size_t>(t.numel()) == v.size(), "make_tensor: {} values for {}", v.size(),
             shape_str(shape));
  auto* bits = static_cast<uint16_t*>(t.raw());
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dtype) {
      case DType::kF16:
        bits[i] = f16_bits(v[i]);
        break;
      case DType::kBF16:
        bits[i] = bf16_bits(v[i]);
        break;
      case DType::kF32:
      case DType::kI8:
      case DType::kI32:
      case DType::kI64:
      case DType::kF8E4M3:
      case DType::kF8E5M2:
      case DType::kI4:
        KILN_FAIL("make_tensor: {} is not a narrow float type", dtype_name(dtype));
    }
  }
  return t;
}

double value_at(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.data<float>()[i];
    case DType::kF16:
      return f16_value(static_cast<const uint16_t*>(t.raw())[i]);
    case DType::kBF16:
      return bf16_value(static_cast<const uint16_t*>(t.raw())[i]);
    case DType::kI8:
      return t.data<int8_t>()[i];
    case DType::kI32:
      return t.data<int32_t>()[i];
    case DType::kI64:
      return static_cast<double>(t.data<int64_t>()[i]);
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI4: {
      float f;  // core/fp8.h's decoding, tested against OCP's definitions in test_dtype.cc
      if (t.dtype() == DType::kI4) {
        float pair[2];
        dtype_traits(t.dtype()).to_float(static_cast<const uint8_t*>(t.raw()) + i / 2, pair, 2);
        return pair[i % 2];
      }
      dtype_traits(t.dtype()).to_float(static_cast<const uint8_t*>(t.raw()) + i, &f, 1);
      return f;
    }
  }
  return NAN;
}

std::vector<float> Gen::floats(int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_value(values_, dist(rng_));
  return v;
}

Tensor Gen::tensor(const std::vector<float>& v, const Shape& shape) const {
  std::vector<float> rounded(v.size());
  for (size_t i = 0; i < v.size(); ++i) rounded[i] = round_value(values_, v[i]);
  return make_tensor(dtype_, rounded, shape);
}

Tensor Gen::random(const Shape& shape, float lo, float hi) {
  return tensor(floats(shape_numel(shape), lo, hi), shape);
}

Scenario one_step(Graph g, std::map<std::string, Tensor> feed) {
  Scenario s;
  s.graph = std::move(g);
  s.steps.push_back(ScenarioStep{std::move(feed), std::nullopt, {}});
  return s;
}

std::string unsupported(const Backend& backend, const Graph& graph) {
  for (const Node& n : graph.nodes) {
    std::string why = backend.unsupported_reason(graph, n);
    if (!why.empty()) return why;
  }
  return {};
}

ScenarioOutputs run_scenario(Backend& backend, const Scenario& scenario) {
  const Graph& g = scenario.graph;
  std::unique_ptr<Executable> exe = backend.compile(g, test_profile());
  std::unique_ptr<KvStorage> kv;
  if (scenario.kv) {
    kv = backend.create_kv_storage(*scenario.kv);
    kv->resize(scenario.kv_blocks);
  }
  Allocator& memory = backend.allocator();
  std::vector<CrossKv> cross(scenario.cross.size());
  for (size_t i = 0; i < cross.size(); ++i) {
    for (const Tensor& t : scenario.cross[i].keys) cross[i].keys.push_back(memory.upload(t));
    for (const Tensor& t : scenario.cross[i].values) cross[i].values.push_back(memory.upload(t));
  }
  ScenarioOutputs outputs;
  for (const ScenarioStep& step : scenario.steps) {
    std::vector<Tensor> in;
    for (int id : g.inputs) {
      auto it = step.feed.find(g.values[id].name);
      KILN_CHECK(it != step.feed.end(), "scenario feeds no '{}'", g.values[id].name);
      in.push_back(memory.upload(it->second));
    }
    StepLayout layout;
    StepContext context;
    const StepContext* step_context = nullptr;
    if (step.layout) {
      layout = *step.layout;
      for (int s = 0; s < layout.num_seqs(); ++s) {
        const int c = s < static_cast<int>(step.cross.size()) ? step.cross[s] : -1;
        layout.cross[s] = c >= 0 ? &cross[c] : nullptr;
      }
      context = StepContext{&layout, kv.get()};
      step_context = &context;
    }
    std::vector<Tensor> host;
    for (const Tensor& t : exe->execute(in, step_context)) host.push_back(memory.to_host(t));
    outputs.push_back(std::move(host));
  }
  return outputs;
}

double dtype_tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 1e-5;
    case DType::kF16:
      return 0x1p-9;
    case DType::kBF16:
      return 0x1p-6;
    case DType::kI8:
    case DType::kI32:
    case DType::kI64:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI4:
      break;
  }
  return 0.0;
}

void expect_matches(const Tensor& got, const Tensor& ref, const Check& check,
                    const std::string& what) {
  ASSERT_EQ(got.dtype(), ref.dtype()) << what;
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  const int64_t n = ref.numel();
  const int64_t row = ref.rank() > 0 && ref.dim(-1) > 0 ? ref.dim(-1) : 1;
  const double tol = check.tol > 0.0 ? check.tol : dtype_tolerance(ref.dtype());
  const size_t elem_bytes = dtype_bytes(ref.dtype(), 1);
  // The scale each element is measured against: the output's or its row's largest magnitude.
  std::vector<double> scale(static_cast<size_t>(n), 0.0);
  if (check.kind == CheckKind::kMaxRelative || check.kind == CheckKind::kRowRelative) {
    const int64_t span = check.kind == CheckKind::kMaxRelative ? std::max<int64_t>(n, 1) : row;
    for (int64_t begin = 0; begin < n; begin += span) {
      double mx = 0.0;
      for (int64_t i = begin; i < begin + span; ++i)
        if (std::isfinite(value_at(ref, i))) mx = std::max(mx, std::fabs(value_at(ref, i)));
      for (int64_t i = begin; i < begin + span; ++i) scale[i] = mx;
    }
  }
  int64_t failures = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    const double g = value_at(got, i), r = value_at(ref, i);
    bool ok = false;
    if (std::isnan(g) || std::isnan(r)) {
      ok = std::isnan(g) && std::isnan(r);
    } else if (check.kind == CheckKind::kExact) {
      ok = std::memcmp(static_cast<const char*>(got.raw()) + i * elem_bytes,
                       static_cast<const char*>(ref.raw()) + i * elem_bytes, elem_bytes) == 0;
    } else if (std::isinf(r) || std::isinf(g)) {
      ok = g == r;
    } else {
      double bound = 0.0;
      switch (check.kind) {
        case CheckKind::kExact:
          break;
        case CheckKind::kMaxRelative:
        case CheckKind::kRowRelative:
          bound = tol * scale[i];
          break;
        case CheckKind::kElementwise:
          bound = tol * std::fabs(r) + check.atol;
          break;
      }
      ok = std::fabs(g - r) <= bound;
    }
    if (!ok && failures++ == 0) first = i;
  }
  if (failures > 0) {
    const double g = value_at(got, first), r = value_at(ref, first);
    ADD_FAILURE() << what << ": " << failures << " of " << n << " elements differ; first at ["
                  << first << "] (row " << first / row << "): got " << g << ", reference " << r
                  << ", difference " << std::fabs(g - r) << " > "
                  << (check.kind == CheckKind::kExact         ? 0.0
                      : check.kind == CheckKind::kElementwise ? tol * std::fabs(r) + check.atol
                                                              : tol * scale[first]);
  }
}

}  // namespace kiln::test
