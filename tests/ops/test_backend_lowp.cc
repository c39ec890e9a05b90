// Linear and Embedding with weights stored narrower than the f32 activations (bf16, f16, i8 with
// per-channel scales: what `--precision bf16|fp16|int8-weight` plans run), on every CPU kernel
// family against the reference backend, which decodes each weight from its definition and sums
// in double. Also: a row's result does not depend on the batch it runs in (the narrow kernels
// switch strategy with the batch size), and malformed quantized nodes are refused. The AVX512-BF16
// family rounds activations to bf16 for bf16 weights, and is checked on rounded activations; the
// AVX512-VNNI family quantizes activations to int8 (per row, in groups of 128) for i8 weights, and
// is checked on activations quantized the same way; the AVX2 family quantizes them to int16 (one
// scale a row) for i8 weights below 64 rows, and is checked on rows quantized that way.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "../models/graph_runner.h"
#include "backend_ops.h"
#include "core/cpu_features.h"
#include "core/half.h"
#include "graph/packing.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

constexpr uint32_t kSeed = 20240612;

// f32 values rounded to the nearest bf16 (ties to even), still f32.
Tensor round_to_bf16(const Tensor& x) {
  Tensor r = x.clone();
  for (int64_t i = 0; i < r.numel(); ++i)
    r.data<float>()[i] = bf16_to_float(float_to_bf16(r.data<float>()[i]));
  return r;
}

// Each row of x [n, k] as the AVX2 int8-weight Linear sees it below its prefill's row count
// (kernels_lowp_int8.cc): one scale a row, q = x · (32767 / max|row|) rounded to the nearest
// integer (ties to even), times max|row| / 32767.
Tensor quantize_rows_to_int16(const Tensor& x) {
  Tensor r = x.clone();
  const int64_t k = x.dim(x.rank() - 1), n = x.numel() / k;
  for (int64_t t = 0; t < n; ++t) {
    float* row = r.data<float>() + t * k;
    float amax = 0.f;
    for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(row[i]));
    const float inv = amax > 0.f ? 32767.f / amax : 0.f, scale = amax / 32767.f;
    for (int64_t i = 0; i < k; ++i) row[i] = std::nearbyint(row[i] * inv) * scale;
  }
  return r;
}

float max_abs(const float* v, int64_t n) {
  float m = 0.f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

enum class WeightKind : uint8_t { kBf16, kF16, kI8 };
constexpr WeightKind kAllWeightKinds[] = {WeightKind::kBf16, WeightKind::kF16, WeightKind::kI8};

const char* kind_name(WeightKind k) {
  switch (k) {
    case WeightKind::kBf16:
      return "bf16";
    case WeightKind::kF16:
      return "f16";
    case WeightKind::kI8:
      return "i8";
  }
  return "?";
}

// A weight [rows, cols] of the kind: random floats rounded to bf16/f16, or random int8 values
// over the whole range (both ends included) with positive per-row scales.
struct NarrowWeight {
  Tensor w;
  Tensor scales;  // i8 only
};
NarrowWeight narrow_weight(Gen& g, WeightKind kind, int64_t rows, int64_t cols) {
  const std::vector<float> v = g.floats(rows * cols, -1.0f, 1.0f);
  switch (kind) {
    case WeightKind::kBf16:
      return {make_tensor(DType::kBF16, v, {rows, cols}), {}};
    case WeightKind::kF16:
      return {make_tensor(DType::kF16, v, {rows, cols}), {}};
    case WeightKind::kI8: {
      std::vector<int8_t> q(v.size());
      for (size_t i = 0; i < v.size(); ++i) q[i] = static_cast<int8_t>(std::lround(v[i] * 127.0f));
      q[0] = 127;
      q[q.size() - 1] = -127;
      return {Tensor::from_vector(q, {rows, cols}),
              Tensor::from_vector(g.floats(rows, 0.001f, 0.05f), {rows})};
    }
  }
  return {};
}

struct LinearShape {
  int64_t n, in, out;
  bool bias;
  std::optional<Activation> act;
};

// y = act(x · w^T (· scales) + bias) with x [n, in] f32.
Graph linear_graph(Gen& g, WeightKind kind, const LinearShape& s) {
  GraphBuilder b("linear_lowp");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(s.in)});
  NarrowWeight nw = narrow_weight(g, kind, s.out, s.in);
  const int w = b.weight("w", std::move(nw.w));
  const int bias = s.bias ? b.weight("b", g.random({s.out})) : -1;
  int y = kind == WeightKind::kI8
              ? b.linear_quantized(x, w, bias, b.weight("w.scales", std::move(nw.scales)), "fc")
              : b.linear(x, w, bias, "fc");
  if (s.act) y = b.activation(y, *s.act, "act");
  b.output(y, "y");
  Graph graph = b.finish();
  if (s.act) fuse_linear_activation(graph, Logger(LogLevel::kError));
  return graph;
}

struct LowpCase {
  std::string name;
  std::function<Scenario(Gen&)> make;
};
void PrintTo(const LowpCase& c, std::ostream* os) { *os << c.name; }

std::vector<LowpCase> lowp_cases() {
  std::vector<LowpCase> cases;
  // n = 1 and 3 widen the weights in registers, n >= 4 widens them once per row group; `out`
  // is neither a multiple of the 16-row blocks nor of the 4-row groups, `in` not of 8 or 16.
  const LinearShape shapes[] = {
      {1, 64, 16, true, std::nullopt},
      {3, 19, 37, false, std::nullopt},
      {7, 19, 37, true, std::nullopt},
      {7, 19, 37, false, Activation::kGeluTanh},
      {33, 200, 70, true, Activation::kRelu},
      {1, 1030, 5, false, std::nullopt},
      {5, 7, 3, true, std::nullopt},
      // AVX2's prefill path (64 rows and more: weights widened for oneDNN's sgemm).
      {70, 37, 70, true, Activation::kGeluTanh},
  };
  for (WeightKind kind : kAllWeightKinds)
    for (const LinearShape& s : shapes)
      cases.push_back(
          {fmt::format("Linear_{}_weights_n{}_in{}_out{}_{}_{}", kind_name(kind), s.n, s.in, s.out,
                       s.bias ? "bias" : "nobias", s.act ? activation_name(*s.act) : "noact"),
           [=](Gen& g) {
             Graph graph = linear_graph(g, kind, s);
             return one_step(std::move(graph), {{"x", g.random({s.n, s.in}, -2.0f, 2.0f)}});
           }});
  for (WeightKind kind : kAllWeightKinds)
    cases.push_back(
        {fmt::format("Embedding_{}_table", kind_name(kind)), [=](Gen& g) {
           GraphBuilder b("embedding_lowp");
           NarrowWeight nw = narrow_weight(g, kind, 37, 33);
           const int table = b.weight("table", std::move(nw.w));
           const int ids = b.input("ids", DType::kI64, {kTokens});
           const int y =
               kind == WeightKind::kI8
                   ? b.embedding_quantized(table, ids,
                                           b.weight("table.scales", std::move(nw.scales)), "embed")
                   : b.embedding(table, ids, "embed");
           b.output(y, "y");
           return one_step(b.finish(),
                           {{"ids", Tensor::from_vector<int64_t>({36, 0, 5, 5, 17}, {5})}});
         }});
  return cases;
}

class LowPrecisionOps : public testing::TestWithParam<LowpCase> {};

TEST_P(LowPrecisionOps, EveryCpuFamilyMatchesReference) {
  Gen gen(DType::kF32, DType::kF32, kSeed);
  const Scenario scenario = GetParam().make(gen);
  const std::unique_ptr<Backend> reference = reference_backend();
  ASSERT_EQ(unsupported(*reference, scenario.graph), "");
  const ScenarioOutputs ref = run_scenario(*reference, scenario);
  // Weights decode exactly; only the f32 accumulation differs from the double reference (and
  // gathers copy exactly).
  const bool gather = scenario.graph.nodes[0].op == OpKind::kEmbedding;
  const Check check = gather ? Check{CheckKind::kExact} : Check{CheckKind::kMaxRelative, 1e-5};
  // The bf16 dot products round the activations to bf16: on activations that are bf16 already
  // they must match the reference as closely as the f32 kernels do.
  const DType weight = scenario.graph.values[scenario.graph.nodes[0].inputs[1]].dtype;
  const bool bf16_linear = !gather && weight == DType::kBF16;
  Scenario rounded = scenario;
  for (auto& [name, t] : rounded.steps[0].feed)
    if (name == "x") t = round_to_bf16(t);
  const ScenarioOutputs rounded_ref = run_scenario(*reference, rounded);
  // The int8 dot products quantize each activation row: the same rows, quantized here.
  const bool i8_linear = !gather && weight == DType::kI8;
  Scenario quantized = scenario;
  for (auto& [name, t] : quantized.steps[0].feed)
    if (name == "x") t = quantize_rows_to_int8(t);
  const ScenarioOutputs quantized_ref = run_scenario(*reference, quantized);
  // AVX2's integer dot products (below 64 rows) quantize each row to int16.
  const int64_t rows = scenario.steps[0].feed.begin()->second.dim(0);
  Scenario quantized16 = scenario;
  for (auto& [name, t] : quantized16.steps[0].feed)
    if (name == "x") t = quantize_rows_to_int16(t);
  const ScenarioOutputs quantized16_ref = run_scenario(*reference, quantized16);
  std::vector<NamedBackend> backends = available_backends();
  ASSERT_FALSE(backends.empty());
  for (NamedBackend& b : backends) {
    // Narrow weights under f32 activations are the CPU's storage precisions; CUDA plans narrow
    // activations too (narrow_graph) and are tested by the CUDA precision tests.
    if (b.backend->device() != Device::kCpu) continue;
    ASSERT_EQ(unsupported(*b.backend, scenario.graph), "") << b.name;
    if (bf16_linear && b.name == kBf16DotBackend) {
      expect_matches(run_scenario(*b.backend, rounded)[0][0], rounded_ref[0][0], check, b.name);
      continue;
    }
    // ... from two rows up: a single row keeps the f32 FMAs (kernels_vnni.cc, kMinRows).
    const bool one_row = scenario.steps[0].feed.begin()->second.dim(0) == 1;
    if (i8_linear && b.name == kInt8DotBackend && !one_row) {
      expect_matches(run_scenario(*b.backend, scenario)[0][0], quantized_ref[0][0], check, b.name);
      continue;
    }
    if (i8_linear && b.name == "cpu-avx2" && rows < 64) {
      expect_matches(run_scenario(*b.backend, scenario)[0][0], quantized16_ref[0][0], check,
                     b.name);
      continue;
    }
    const ScenarioOutputs got = run_scenario(*b.backend, scenario);
    expect_matches(got[0][0], ref[0][0], check, b.name);
  }
}

// The AVX512-BF16 Linear rounds each activation to the nearest bf16 (ties to even) on its own:
// on f32 activations it gives what the reference gives on the rounded ones. Every row count
// up to two full tiles and beyond, an odd `in` (the last pair is half empty) and an even one, an
// `out` that ends in a narrower panel.
TEST(LowPrecisionOps, Bf16DotProductsRoundActivationsToNearestEven) {
  std::vector<NamedBackend> backends = available_backends();
  const auto dot = std::find_if(backends.begin(), backends.end(),
                                [](const NamedBackend& b) { return b.name == kBf16DotBackend; });
  if (dot == backends.end()) GTEST_SKIP() << "no AVX512-BF16 here";
  const std::unique_ptr<Backend> reference = reference_backend();
  for (const LinearShape& s : {LinearShape{17, 1031, 45, true, std::nullopt},
                               LinearShape{16, 64, 32, false, Activation::kGeluTanh},
                               LinearShape{1, 2, 16, false, std::nullopt}}) {
    Gen g(DType::kF32, DType::kF32, kSeed);
    const Graph graph = linear_graph(g, WeightKind::kBf16, s);
    std::vector<float> x = g.floats(s.n * s.in, -2.0f, 2.0f);
    // Ties between two bf16 values, which round to the even one.
    x[0] = std::bit_cast<float>(0x3f808000u);  // 1 + 2^-8: down to 1
    x[1] = std::bit_cast<float>(0x3f818000u);  // up to 1 + 2^-6
    for (int64_t n = 1; n <= s.n; n += n < 10 ? 1 : 7) {
      const Tensor xt =
          Tensor::from_vector(std::vector<float>(x.begin(), x.begin() + n * s.in), {n, s.in});
      const Tensor got = run_scenario(*dot->backend, one_step(graph, {{"x", xt}}))[0][0];
      const Tensor want =
          run_scenario(*reference, one_step(graph, {{"x", round_to_bf16(xt)}}))[0][0];
      expect_matches(got, want, Check{CheckKind::kMaxRelative, 1e-5},
                     fmt::format("n={} in={} out={}", n, s.in, s.out));
    }
  }
}

// The AVX512-VNNI Linear quantizes each activation row on its own, in groups of 128 elements
// (scale max|group| / 127, ties to even), and sums each group's products exactly in integers: on
// f32 activations it gives what the reference gives on the quantized rows. Every row count up to
// two full tiles and beyond; `in` a multiple of 128 (1024, 768), of 64 only, of 4 only, and not of
// 4 (the last quad is partial: 1031, 19, 3, 2); `out` ending in a narrower panel and below one
// panel; a row of zeros (its outputs are the bias) and a row with one large value among small ones
// (only its group rounds the small ones to few levels). A single row keeps the f32 FMAs (kMinRows
// in kernels_vnni.cc: faster at batch 1) and matches the reference on its unquantized values.
TEST(LowPrecisionOps, Int8DotProductsQuantizeEachActivationRow) {
  std::vector<NamedBackend> backends = available_backends();
  const auto dot = std::find_if(backends.begin(), backends.end(),
                                [](const NamedBackend& b) { return b.name == kInt8DotBackend; });
  if (dot == backends.end()) GTEST_SKIP() << "no AVX512-VNNI and AVX512-VBMI here";
  const std::unique_ptr<Backend> reference = reference_backend();
  int checked = 0;
  for (const LinearShape& s :
       {LinearShape{17, 1031, 45, true, std::nullopt},
        LinearShape{16, 64, 32, false, Activation::kGeluTanh},
        LinearShape{9, 1024, 48, true, std::nullopt},
        LinearShape{11, 20, 70, true, Activation::kRelu},
        LinearShape{3, 19, 5, false, std::nullopt}, LinearShape{2, 3, 16, true, std::nullopt},
        LinearShape{1, 2, 16, false, std::nullopt},
        // Prompt-sized calls: three to five row tiles over each group of panels, full groups
        // and a narrow last panel.
        LinearShape{40, 1031, 100, true, Activation::kGeluTanh},
        LinearShape{26, 768, 96, false, std::nullopt}}) {
    Gen g(DType::kF32, DType::kF32, kSeed);
    const Graph graph = linear_graph(g, WeightKind::kI8, s);
    std::vector<float> x = g.floats(s.n * s.in, -2.0f, 2.0f);
    if (s.n > 2) {
      std::fill(x.begin() + s.in, x.begin() + 2 * s.in, 0.f);  // row 1: zeros
      for (int64_t i = 0; i < s.in; ++i) x[2 * s.in + i] *= 1e-3f;
      x[2 * s.in + s.in / 2] = 40.f;  // row 2: one outlier
    }
    for (int64_t n = 1; n <= s.n; n += n < 10 ? 1 : 7) {
      const Tensor xt =
          Tensor::from_vector(std::vector<float>(x.begin(), x.begin() + n * s.in), {n, s.in});
      const Tensor got = run_scenario(*dot->backend, one_step(graph, {{"x", xt}}))[0][0];
      // One row alone keeps the f32 FMAs (kMinRows): the reference on the row as it is.
      const Tensor want = run_scenario(
          *reference, one_step(graph, {{"x", n == 1 ? xt : quantize_rows_to_int8(xt)}}))[0][0];
      expect_matches(got, want, Check{CheckKind::kMaxRelative, 1e-5},
                     fmt::format("n={} in={} out={}", n, s.in, s.out));
      ++checked;
      if (n >= 17) {
        // In a prompt-sized call a row's sums are bitwise those of the same rows as a pair.
        const Tensor pair = run_scenario(
            *dot->backend,
            one_step(graph,
                     {{"x", Tensor::from_vector(std::vector<float>(x.begin(), x.begin() + 2 * s.in),
                                                {2, s.in})}}))[0][0];
        for (int64_t o = 0; o < 2 * s.out; ++o)
          ASSERT_EQ(pair.data<float>()[o], got.data<float>()[o])
              << "n=" << n << " in=" << s.in << " out=" << s.out << " output " << o;
      }
    }
  }
  EXPECT_GT(checked, 50);
}

// The AVX2 int8-weight Linear below its prefill's row count (kernels_lowp_int8.cc) quantizes
// each activation row to int16 with one scale and sums the products exactly in integers: on f32
// activations it gives what the reference gives on the quantized rows, and each row is bitwise
// the same alone as in any batch up to 63 rows. `in` a multiple of 16 and not, below 16, and past
// 2048 (the int32 lanes go into 64-bit totals); a row of zeros, a row with one outlier, and a row
// holding a NaN or an infinity (NaN outputs, its neighbours untouched).
TEST(LowPrecisionOps, Avx2Int8DotProductsQuantizeEachRowToInt16) {
  std::vector<NamedBackend> backends = available_backends();
  const auto avx2 = std::find_if(backends.begin(), backends.end(),
                                 [](const NamedBackend& b) { return b.name == "cpu-avx2"; });
  ASSERT_NE(avx2, backends.end());
  const std::unique_ptr<Backend> reference = reference_backend();
  for (const LinearShape& s :
       {LinearShape{63, 1031, 45, true, std::nullopt},
        LinearShape{17, 4100, 21, false, Activation::kGeluTanh},
        LinearShape{9, 32, 16, true, std::nullopt}, LinearShape{5, 3, 7, true, std::nullopt}}) {
    Gen g(DType::kF32, DType::kF32, kSeed);
    const Graph graph = linear_graph(g, WeightKind::kI8, s);
    std::vector<float> x = g.floats(s.n * s.in, -2.0f, 2.0f);
    std::fill(x.begin() + s.in, x.begin() + 2 * s.in, 0.f);  // row 1: zeros
    for (int64_t i = 0; i < s.in; ++i) x[2 * s.in + i] *= 1e-3f;
    x[2 * s.in + s.in / 2] = 40.f;                      // row 2: one outlier
    x[3 * s.in + s.in - 1] = s.n > 9 ? INFINITY : NAN;  // row 3: not finite
    auto run = [&](Backend& b, int64_t first, int64_t n, bool quantize) {
      Tensor xt = Tensor::from_vector(
          std::vector<float>(x.begin() + first * s.in, x.begin() + (first + n) * s.in), {n, s.in});
      if (quantize) xt = quantize_rows_to_int16(xt);
      return run_scenario(b, one_step(graph, {{"x", xt}}))[0][0];
    };
    const Tensor all = run(*avx2->backend, 0, s.n, false);
    for (int64_t o = 0; o < s.out; ++o)
      ASSERT_TRUE(std::isnan(all.data<float>()[3 * s.out + o])) << "in=" << s.in << " o=" << o;
    // Rows 0-2 and 4.. against the reference on the quantized rows, within f32 summation.
    for (int64_t first : {int64_t{0}, int64_t{4}}) {
      const int64_t n = first == 0 ? 3 : s.n - 4;
      const Tensor want = run(*reference, first, n, true);
      const Tensor got =
          Tensor::from_vector(std::vector<float>(all.data<float>() + first * s.out,
                                                 all.data<float>() + (first + n) * s.out),
                              {n, s.out});
      expect_matches(got, want, Check{CheckKind::kMaxRelative, 1e-5},
                     fmt::format("in={} rows {}..{}", s.in, first, first + n));
    }
    // Each row alone, and in every batch that starts with it, gives the bits of the full batch.
    for (int64_t r = 0; r < s.n; ++r)
      for (int64_t n : {int64_t{1}, int64_t{2}, s.n - r}) {
        if (r + n > s.n) continue;
        const Tensor part = run(*avx2->backend, r, n, false);
        EXPECT_EQ(
            std::memcmp(part.data<float>(), all.data<float>() + r * s.out, s.out * sizeof(float)),
            0)
            << "in=" << s.in << " row " << r << " in a call of " << n;
      }
  }
}

// Full-scale sums: every weight ±127 and every activation the row's maximum (q = ±32767), so
// each output is exactly ±in · 127 · scale; at in = 4100 the sum (1.7e10) is far past int32.
TEST(LowPrecisionOps, Avx2Int8DotProductsSumFullScaleRowsExactly) {
  std::vector<NamedBackend> backends = available_backends();
  const auto avx2 = std::find_if(backends.begin(), backends.end(),
                                 [](const NamedBackend& b) { return b.name == "cpu-avx2"; });
  ASSERT_NE(avx2, backends.end());
  const int64_t in = 4100, out = 6;
  std::vector<int8_t> q(static_cast<size_t>(in * out));
  for (int64_t o = 0; o < out; ++o)
    std::fill(q.begin() + o * in, q.begin() + (o + 1) * in,
              static_cast<int8_t>(o % 2 ? -127 : 127));
  const std::vector<float> scales = {0.5f, 0.25f, 1.f, 2.f, 0.125f, 1.f};
  GraphBuilder b("full_scale");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(in)});
  const int w = b.weight("w", Tensor::from_vector(q, {out, in}));
  b.output(b.linear_quantized(x, w, -1, b.weight("s", Tensor::from_vector(scales, {out})), "fc"),
           "y");
  const Graph graph = b.finish();
  for (float v : {3.f, -1.5f}) {
    const Tensor xt = Tensor::from_vector(std::vector<float>(2 * in, v), {2, in});
    const Tensor y = run_scenario(*avx2->backend, one_step(graph, {{"x", xt}}))[0][0];
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t o = 0; o < out; ++o) {
        // f32(in · 127 · 32767) · (|v| / 32767) · scale, each step rounded as the kernel does.
        const float total = static_cast<float>(int64_t{in} * 127 * 32767) * (o % 2 ? -1.f : 1.f) *
                            (v < 0 ? -1.f : 1.f);
        const float want = total * (std::fabs(v) / 32767.f) * scales[o];
        EXPECT_EQ(y.data<float>()[t * out + o], want) << "v=" << v << " row " << t << " o=" << o;
        EXPECT_NEAR(y.data<float>()[t * out + o], in * 127.0 * v * scales[o] * (o % 2 ? -1 : 1),
                    1e-5 * in * 127.0 * std::fabs(v) * scales[o]);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(BackendOps, LowPrecisionOps, testing::ValuesIn(lowp_cases()),
                         [](const testing::TestParamInfo<LowpCase>& info) {
                           return info.param.name;
                         });

// Each row of a 9-row batch (widened once) gives exactly what the row alone (widened in
// registers) gives, on every kernel family.
//
// The int8 dot products' family gives i8 weights this property from two rows up only: a row alone
// keeps the f32 FMAs (kMinRows in kernels_vnni.cc). There each row is checked bitwise in a pair
// (with the next row) against the 9-row batch, and alone within the int8 activation rounding.
TEST(LowPrecisionOps, RowResultsDoNotDependOnTheBatch) {
  for (WeightKind kind : kAllWeightKinds) {
    Gen g(DType::kF32, DType::kF32, kSeed);
    const LinearShape s{9, 300, 45, true, Activation::kGeluTanh};
    const Graph graph = linear_graph(g, kind, s);
    const std::vector<float> x = g.floats(s.n * s.in, -2.0f, 2.0f);
    const Scenario batch = one_step(graph, {{"x", Tensor::from_vector(x, {s.n, s.in})}});
    for (NamedBackend& b : available_backends()) {
      const bool from_two = kind == WeightKind::kI8 && b.name == kInt8DotBackend;
      const Tensor all = run_scenario(*b.backend, batch)[0][0];
      for (int64_t r = 0; r < s.n; ++r) {
        const std::vector<float> row(x.begin() + r * s.in, x.begin() + (r + 1) * s.in);
        const Scenario alone = one_step(graph, {{"x", Tensor::from_vector(row, {1, s.in})}});
        const Tensor one = run_scenario(*b.backend, alone)[0][0];
        if (from_two) {
          std::vector<float> pair = row;
          const int64_t other = (r + 1) % s.n;
          pair.insert(pair.end(), x.begin() + other * s.in, x.begin() + (other + 1) * s.in);
          const Tensor two = run_scenario(
              *b.backend, one_step(graph, {{"x", Tensor::from_vector(pair, {2, s.in})}}))[0][0];
          for (int64_t o = 0; o < s.out; ++o) {
            ASSERT_EQ(two.data<float>()[o], all.data<float>()[r * s.out + o])
                << b.name << " " << kind_name(kind) << " row " << r << " of a pair, output " << o;
            // int8 activations in groups of 128 (steps of max|group| / 127 = 1/64 here): within a
            // few percent of the row's largest output.
            ASSERT_NEAR(one.data<float>()[o], all.data<float>()[r * s.out + o],
                        0.05f * max_abs(one.data<float>(), s.out))
                << b.name << " " << kind_name(kind) << " row " << r << " alone, output " << o;
          }
          continue;
        }
        for (int64_t o = 0; o < s.out; ++o)
          ASSERT_EQ(one.data<float>()[o], all.data<float>()[r * s.out + o])
              << b.name << " " << kind_name(kind) << " row " << r << " output " << o;
      }
    }
  }
}

// One AVX-512 family (f32 FMAs, bf16 dot products for bf16 weights or int8 dot products for i8
// weights): see below.
void expect_packed_weights_give_the_plain_bits(bool bf16_dot, bool int8_dot) {
  ContextOptions options{LogLevel::kError, 3};
  options.cpu_isa = CpuIsa::kAvx512;
  options.cpu_bf16_dot = bf16_dot;
  options.cpu_int8_dot = int8_dot;
  Context ctx(options);
  const std::unique_ptr<Backend> cpu = make_cpu_backend(ctx);
  const int64_t in = 45, out = 70, max_rows = 130;
  for (int kind = -1; kind < 3; ++kind) {
    Gen g(DType::kF32, DType::kF32, kSeed + kind);
    NarrowWeight nw = kind < 0 ? NarrowWeight{g.random({out, in}), {}}
                               : narrow_weight(g, static_cast<WeightKind>(kind), out, in);
    const std::string name = kind < 0 ? "f32" : kind_name(static_cast<WeightKind>(kind));
    auto graph_with = [&](bool packed) {
      GraphBuilder b("linear_packed");
      const int x = b.input("x", DType::kF32, {kTokens, Dim::of(in)});
      const int ids = b.input("ids", DType::kI64, {kTokens});
      const int w = b.weight("w", nw.w);
      const int bias = b.weight("b", Gen(DType::kF32, DType::kF32, 7).random({out}));
      const bool q = nw.scales.defined();
      const int scales = q ? b.weight("w.scales", nw.scales) : -1;
      b.output(q ? b.linear_quantized(x, w, bias, scales, "fc") : b.linear(x, w, bias, "fc"), "y");
      b.output(q ? b.embedding_quantized(w, ids, scales, "embed") : b.embedding(w, ids, "embed"),
               "e");
      Graph graph = b.finish();
      graph.nodes[0].attr<LinearAttrs>().epilogue.activation = Activation::kGeluTanh;
      if (packed) {
        Value& v = graph.values[w];
        Tensor p = Tensor::empty(v.data.dtype(), v.data.shape());
        pack_panel16(v.data.raw(), p.raw(), out, in, dtype_bytes(v.data.dtype(), 1));
        v.data = p;
        v.layout = panel16_layout();
      }
      return graph;
    };
    const Graph plain = graph_with(false), packed = graph_with(true);
    std::unique_ptr<Executable> a = cpu->compile(plain, test_profile());
    std::unique_ptr<Executable> b = cpu->compile(packed, test_profile());
    const std::vector<float> x = g.floats(max_rows * in, -2.0f, 2.0f);
    std::vector<int64_t> ids(max_rows);
    for (int64_t i = 0; i < max_rows; ++i) ids[i] = (i * 37) % out;
    auto run = [&](Executable& exe, int64_t n) {
      const std::vector<Tensor> inputs = {
          Tensor::from_vector(std::vector<float>(x.begin(), x.begin() + n * in), {n, in}),
          Tensor::from_vector(std::vector<int64_t>(ids.begin(), ids.begin() + n), {n})};
      std::span<const Tensor> y = exe.execute(inputs, nullptr);
      return std::pair<Tensor, Tensor>{y[0].clone(), y[1].clone()};
    };
    std::vector<std::pair<Tensor, Tensor>> alone;
    for (int64_t r = 0; r < 3; ++r) alone.push_back(run(*b, r + 1));
    for (int64_t n : {1, 2, 3, 7, 8, 9, 16, 17, 64, 130}) {
      const auto [yp, ep] = run(*b, n);
      const auto [ya, ea] = run(*a, n);
      EXPECT_EQ(std::memcmp(yp.raw(), ya.raw(), yp.nbytes()), 0) << name << " n=" << n;
      EXPECT_EQ(std::memcmp(ep.raw(), ea.raw(), ep.nbytes()), 0) << name << " embedding n=" << n;
      for (int64_t r = 0; r < std::min<int64_t>(n, 3); ++r) {
        // The int8 dot products take rows from two up (kMinRows): one row alone (r = 0 of a
        // 1-row call) keeps the f32 FMAs and is compared within the int8 activation rounding.
        if (int8_dot && kind == static_cast<int>(WeightKind::kI8) && (r == 0) != (n == 1)) {
          for (int64_t o = 0; o < out; ++o)
            EXPECT_NEAR(yp.data<float>()[r * out + o], alone[r].first.data<float>()[r * out + o],
                        0.05f * max_abs(alone[r].first.data<float>() + r * out, out))
                << name << ": row " << r << " of " << n << ", output " << o;
          continue;
        }
        EXPECT_EQ(std::memcmp(yp.data<float>() + r * out, alone[r].first.data<float>() + r * out,
                              out * sizeof(float)),
                  0)
            << name << ": row " << r << " of " << n;
      }
    }
  }
}

// The AVX-512 Linear over panel16-packed weights (a plan packed at build time, or plain weights
// it packs at load): every row of every batch size, prefill sizes included, is bit-identical to
// the row alone, and to the same graph with weights the plan stores plain; an Embedding gathers
// the same rows from a packed table (BLOOM's tied lm_head). f32 and every narrow kind; `out`
// ends in a narrower panel.
TEST(LowPrecisionOps, PackedWeightsGiveThePlainBitsAtEveryBatchSize) {
  if (best_cpu_isa(detect_cpu_features()) != CpuIsa::kAvx512) GTEST_SKIP() << "no AVX-512 here";
  const CpuFeatures f = detect_cpu_features();
  for (int family = 0; family < 3; ++family) {
    const bool bf16_dot = family == 1, int8_dot = family == 2;
    if (bf16_dot && !f.avx512_bf16) continue;
    if (int8_dot && !(f.avx512_vnni && f.avx512_vbmi)) continue;
    SCOPED_TRACE(bf16_dot ? "bf16 dot products" : int8_dot ? "int8 dot products" : "f32 FMAs");
    expect_packed_weights_give_the_plain_bits(bf16_dot, int8_dot);
  }
}

// An i8 weight without scales, or scales on a float weight, is refused when the graph is built.
TEST(LowPrecisionOps, QuantizedNodesNeedTheirScales) {
  Gen g(DType::kF32, DType::kF32, kSeed);
  {
    GraphBuilder b("missing_scales");
    const int x = b.input("x", DType::kF32, {kTokens, Dim::of(8)});
    const int w = b.weight("w", narrow_weight(g, WeightKind::kI8, 4, 8).w);
    EXPECT_THROW(b.linear(x, w, -1, "fc"), Error);
    const int ids = b.input("ids", DType::kI64, {kTokens});
    EXPECT_THROW(b.embedding(w, ids, "embed"), Error);
  }
  {
    GraphBuilder b("stray_scales");
    const int ids = b.input("ids", DType::kI64, {kTokens});
    const int table = b.weight("table", g.random({4, 8}));
    const int scales = b.weight("s", g.random({4}));
    EXPECT_THROW(b.embedding_quantized(table, ids, scales, "embed"), Error);
    const int q = b.weight("q", narrow_weight(g, WeightKind::kI8, 4, 8).w);
    EXPECT_THROW(b.embedding_quantized(q, ids, b.weight("short", g.random({3})), "embed"), Error);
  }
}

}  // namespace
}  // namespace kiln::test
