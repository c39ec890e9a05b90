// Every op through the CPU backend against naive references written here from the math, in
// double precision (never by calling kiln kernels). Each graph holds one node (or a pair fused by
// a pass) and is fed fixed-seed random data.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <optional>
#include <random>

#include "backend/backend.h"
#include "f16_reference.h"
#include "graph/builder.h"
#include "graph/position_bias.h"
#include "graph/verifier.h"
#include "passes/pass.h"
#include "runtime/kv_cache.h"

namespace kiln {
namespace {

using test::f16_value;

constexpr double kRtol = 1e-5;
const Dim kTokens = Dim::sym("tokens");

std::vector<float> random_floats(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor f32(const std::vector<float>& v, Shape shape) { return Tensor::from_vector(v, shape); }

// Every element within kRtol of the reference, measured against the reference's largest
// magnitude (the design's parity metric), with the first offending index in the message.
void expect_close(const Tensor& got, const std::vector<double>& ref, const std::string& what,
                  double rtol = kRtol) {
  ASSERT_EQ(got.dtype(), DType::kF32) << what;
  ASSERT_EQ(static_cast<size_t>(got.numel()), ref.size()) << what;
  double max_ref = 0.0;
  for (double r : ref) max_ref = std::max(max_ref, std::fabs(r));
  const float* g = got.data<float>();
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_FALSE(std::isnan(g[i])) << what << " [" << i << "]";
    ASSERT_NEAR(g[i], ref[i], rtol * std::max(max_ref, 1e-30)) << what << " [" << i << "]";
  }
}

double ref_activation(Activation act, double x) {
  switch (act) {
    case Activation::kRelu:
      return x > 0.0 ? x : 0.0;
    case Activation::kGeluTanh:
      return 0.5 * x *
             (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    case Activation::kGeluExact:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Activation::kSilu:
      return x / (1.0 + std::exp(-x));
  }
  return NAN;
}

constexpr Activation kAllActivations[] = {Activation::kRelu, Activation::kGeluTanh,
                                          Activation::kGeluExact, Activation::kSilu};

class Ops : public testing::Test {
 protected:
  TensorMap run(const Graph& g, const TensorMap& in, const AttentionBatch* batch = nullptr) {
    return make_cpu_backend(ctx_)->compile(g)->execute(in, batch);
  }
  Context ctx_{ContextOptions{LogLevel::kWarning, 3}};
  Logger log_{LogLevel::kWarning};
  std::mt19937 rng_{20240611};
};

// ---- Embedding, GatherRows ---------------------------------------------------------------

TEST_F(Ops, EmbeddingCopiesRowsAndRejectsOutOfRangeIds) {
  const int64_t vocab = 10, d = 6;
  const std::vector<float> table = random_floats(rng_, vocab * d);
  for (DType id_type : {DType::kI64, DType::kI32}) {
    GraphBuilder b("embedding");
    const int t = b.weight("table", f32(table, {vocab, d}));
    b.output(b.embedding(t, b.input("ids", id_type, {kTokens}), "embed"), "y");
    const Graph g = b.finish();
    const std::vector<int64_t> ids = {3, 0, 9, 3, 7};
    const Tensor y = run(g, {{"ids", Tensor::from_vector(ids, {5}).to(id_type)}}).at("y");
    ASSERT_EQ(y.shape(), (Shape{5, d}));
    for (size_t r = 0; r < ids.size(); ++r)
      for (int64_t c = 0; c < d; ++c)
        EXPECT_EQ(y.data<float>()[r * d + c], table[ids[r] * d + c]) << r << "," << c;
    for (int64_t bad : {vocab, int64_t{-1}, int64_t{1000000}}) {
      const Tensor bad_ids = Tensor::from_vector(std::vector<int64_t>{0, bad}, {2}).to(id_type);
      EXPECT_THROW(run(g, {{"ids", bad_ids}}), Error) << bad;
    }
  }
}

TEST_F(Ops, GatherRowsPicksRowsAndRejectsOutOfRange) {
  const int64_t n = 6, d = 5;
  const std::vector<float> x = random_floats(rng_, n * d);
  GraphBuilder b("gather");
  const int xi = b.input("x", DType::kF32, {kTokens, Dim::of(d)});
  b.output(b.gather_rows(xi, b.input("rows", DType::kI64, {Dim::sym("rows")}), "gather"), "y");
  const Graph g = b.finish();
  const std::vector<int64_t> rows = {5, 0, 5, 2};
  const Tensor y =
      run(g, {{"x", f32(x, {n, d})}, {"rows", Tensor::from_vector(rows, {4})}}).at("y");
  ASSERT_EQ(y.shape(), (Shape{4, d}));
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t c = 0; c < d; ++c) EXPECT_EQ(y.data<float>()[r * d + c], x[rows[r] * d + c]);
  for (int64_t bad : {6, -1}) {
    const std::vector<int64_t> bad_rows = {0, bad};
    EXPECT_THROW(run(g, {{"x", f32(x, {n, d})}, {"rows", Tensor::from_vector(bad_rows, {2})}}),
                 Error)
        << bad;
  }
}

// ---- Linear ---------------------------------------------------------------------------------

std::vector<double> ref_linear(const std::vector<float>& x, const std::vector<float>& w,
                               const std::vector<float>* bias, int64_t n, int64_t in, int64_t out,
                               const Activation* act) {
  std::vector<double> y(n * out);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double acc = bias ? (*bias)[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) acc += static_cast<double>(x[t * in + i]) * w[o * in + i];
      y[t * out + o] = act ? ref_activation(*act, acc) : acc;
    }
  return y;
}

TEST_F(Ops, LinearWithAndWithoutBiasAndEachFusedActivation) {
  const int64_t n = 7, in = 19, out = 37;  // out not a multiple of the kernel's 16-row blocks
  const std::vector<float> x = random_floats(rng_, n * in, -2, 2),
                           w = random_floats(rng_, out * in), bias = random_floats(rng_, out);
  for (bool with_bias : {false, true}) {
    std::vector<std::optional<Activation>> acts = {std::nullopt};
    acts.insert(acts.end(), std::begin(kAllActivations), std::end(kAllActivations));
    for (std::optional<Activation> act : acts) {
      const std::string what = std::string(with_bias ? "bias " : "no bias ") +
                               (act ? std::string(activation_name(*act)) : "no activation");
      GraphBuilder b("linear");
      const int xi = b.input("x", DType::kF32, {kTokens, Dim::of(in)});
      const int bi = with_bias ? b.weight("b", f32(bias, {out})) : -1;
      int y = b.linear(xi, b.weight("w", f32(w, {out, in})), bi, "fc");
      if (act) y = b.activation(y, *act, "act");
      b.output(y, "y");
      Graph g = b.finish();
      if (act) {  // fused by the pass, as the pipeline does
        ASSERT_EQ(fuse_linear_activation(g, log_), 1) << what;
        verify_graph(g);
        ASSERT_EQ(g.nodes.size(), 1u) << what;
        ASSERT_TRUE(g.nodes[0].attrs.has_activation) << what;
        EXPECT_EQ(g.nodes[0].attrs.activation, *act) << what;
      }
      const Tensor out_t = run(g, {{"x", f32(x, {n, in})}}).at("y");
      ASSERT_EQ(out_t.shape(), (Shape{n, out}));
      expect_close(out_t,
                   ref_linear(x, w, with_bias ? &bias : nullptr, n, in, out, act ? &*act : nullptr),
                   what);
    }
  }
}

// ---- Elementwise ----------------------------------------------------------------------------

// Sums and products of two floats are exact in double, so the kernels must match bit for bit.
TEST_F(Ops, AddMulScaleAreExactlyRounded) {
  const int64_t n = 9, d = 31;
  const std::vector<float> a = random_floats(rng_, n * d, -10, 10),
                           c = random_floats(rng_, n * d, -10, 10);
  const float factor = -0.3721f;
  GraphBuilder b("elementwise");
  const int ai = b.input("a", DType::kF32, {kTokens, Dim::of(d)});
  const int ci = b.input("b", DType::kF32, {kTokens, Dim::of(d)});
  b.output(b.add(ai, ci, "add"), "sum");
  b.output(b.mul(ai, ci, "mul"), "prod");
  b.output(b.scale(ai, factor, "scale"), "scaled");
  const Graph g = b.finish();
  TensorMap out = run(g, {{"a", f32(a, {n, d})}, {"b", f32(c, {n, d})}});
  for (int64_t i = 0; i < n * d; ++i) {
    const double x = a[i], y = c[i];
    EXPECT_EQ(out.at("sum").data<float>()[i], static_cast<float>(x + y)) << i;
    EXPECT_EQ(out.at("prod").data<float>()[i], static_cast<float>(x * y)) << i;
    EXPECT_EQ(out.at("scaled").data<float>()[i], static_cast<float>(x * double{factor})) << i;
  }
}

TEST_F(Ops, ActivationAndGatedActivationEachKind) {
  std::vector<float> x = random_floats(rng_, 200, -6.0f, 6.0f);
  for (float special : {0.0f, -0.0f, 1e-6f, -1e-6f, 20.0f, -20.0f, 60.0f, -60.0f})
    x.push_back(special);
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<float> up = random_floats(rng_, n);
  for (Activation act : kAllActivations) {
    GraphBuilder b("activation");
    const int xi = b.input("x", DType::kF32, {kTokens, Dim::of(1)});
    b.output(b.activation(xi, act, "act"), "y");
    b.output(
        b.gated_activation(xi, b.input("up", DType::kF32, {kTokens, Dim::of(1)}), act, "gated"),
        "gated_y");
    const Graph g = b.finish();
    TensorMap out = run(g, {{"x", f32(x, {n, 1})}, {"up", f32(up, {n, 1})}});
    // Per element: relative to the value, plus a small absolute term for the tails where
    // 1 + tanh / 1 + erf cancel in f32 (as they do in PyTorch's f32 formulas).
    for (int64_t i = 0; i < n; ++i) {
      const double r = ref_activation(act, x[i]);
      EXPECT_NEAR(out.at("y").data<float>()[i], r, kRtol * std::fabs(r) + 1e-6)
          << activation_name(act) << "(" << x[i] << ")";
      EXPECT_NEAR(out.at("gated_y").data<float>()[i], r * up[i], kRtol * std::fabs(r) + 1e-6)
          << "gated " << activation_name(act) << "(" << x[i] << ")";
    }
  }
}

TEST_F(Ops, SoftmaxIncludingLargeAndInfiniteScores) {
  const int64_t d = 17;
  std::vector<float> x = random_floats(rng_, d, -3, 3);                    // row 0: ordinary
  for (float v : random_floats(rng_, d, -3, 3)) x.push_back(1000.0f + v);  // needs the max shift
  for (float v : random_floats(rng_, d, -80, 80)) x.push_back(v);          // wide range
  std::vector<float> masked = random_floats(rng_, d);
  masked[3] = masked[10] = -std::numeric_limits<float>::infinity();  // masked-out scores
  x.insert(x.end(), masked.begin(), masked.end());
  const int64_t n = 4;
  GraphBuilder b("softmax");
  b.output(b.softmax(b.input("x", DType::kF32, {kTokens, Dim::of(d)}), "softmax"), "y");
  const Graph g = b.finish();
  const Tensor y = run(g, {{"x", f32(x, {n, d})}}).at("y");
  std::vector<double> ref(n * d);
  for (int64_t r = 0; r < n; ++r) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < d; ++i) mx = std::max(mx, static_cast<double>(x[r * d + i]));
    for (int64_t i = 0; i < d; ++i) sum += std::exp(x[r * d + i] - mx);
    for (int64_t i = 0; i < d; ++i) ref[r * d + i] = std::exp(x[r * d + i] - mx) / sum;
  }
  expect_close(y, ref, "softmax");
  EXPECT_EQ(y.data<float>()[3 * d + 3], 0.0f);
}

// ---- Norms ----------------------------------------------------------------------------------

std::vector<double> ref_rms_norm(const std::vector<float>& x, const std::vector<float>& w,
                                 int64_t n, int64_t d, double eps) {
  std::vector<double> y(n * d);
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[r * d + i]) * x[r * d + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = x[r * d + i] * inv * w[i];
  }
  return y;
}

// Rows: ordinary, tiny (eps dominates the variance), large, and all zeros.
std::vector<float> norm_rows(std::mt19937& rng, int64_t d) {
  std::vector<float> x = random_floats(rng, d, -2, 2);
  for (float v : random_floats(rng, d, -1e-4f, 1e-4f)) x.push_back(v);
  for (float v : random_floats(rng, d, -300, 300)) x.push_back(v);
  x.resize(x.size() + d, 0.0f);
  return x;
}

TEST_F(Ops, RmsNormT5) {
  const int64_t d = 24, n = 4;
  const double eps = 1e-6;
  const std::vector<float> x = norm_rows(rng_, d), w = random_floats(rng_, d, 0.5f, 1.5f);
  GraphBuilder b("rms");
  const int xi = b.input("x", DType::kF32, {kTokens, Dim::of(d)});
  b.output(b.rms_norm(xi, b.weight("w", f32(w, {d})), eps, "norm"), "y");
  const Graph g = b.finish();
  const Tensor y = run(g, {{"x", f32(x, {n, d})}}).at("y");
  const std::vector<double> ref = ref_rms_norm(x, w, n, d, eps);
  // Row by row: the rows' scales differ, so each is compared to its own magnitude.
  for (int64_t r = 0; r < n; ++r)
    expect_close(y.slice_rows(r, r + 1).clone(),
                 std::vector<double>(ref.begin() + r * d, ref.begin() + (r + 1) * d),
                 "row " + std::to_string(r));
}

TEST_F(Ops, LayerNorm) {
  const int64_t d = 33, n = 5;
  const double eps = 1e-5;
  std::vector<float> x = norm_rows(rng_, d);
  for (float v : random_floats(rng_, d, -1, 1)) x.push_back(1000.0f + v);  // large mean
  const std::vector<float> w = random_floats(rng_, d, 0.5f, 1.5f), bias = random_floats(rng_, d);
  GraphBuilder b("ln");
  const int xi = b.input("x", DType::kF32, {kTokens, Dim::of(d)});
  b.output(b.layer_norm(xi, b.weight("w", f32(w, {d})), b.weight("b", f32(bias, {d})), eps, "ln"),
           "y");
  const Graph g = b.finish();
  const Tensor y = run(g, {{"x", f32(x, {n, d})}}).at("y");
  std::vector<double> ref(n * d);
  for (int64_t r = 0; r < n; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < d; ++i) mean += x[r * d + i];
    mean /= d;
    for (int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mean) * (x[r * d + i] - mean);
    var /= d;
    for (int64_t i = 0; i < d; ++i)
      ref[r * d + i] = (x[r * d + i] - mean) / std::sqrt(var + eps) * w[i] + bias[i];
  }
  // The large-mean row: the kernel subtracts the mean rounded to f32 (as torch does), which
  // costs about ulp(1000) / std of accuracy; compare it more loosely.
  expect_close(y.slice_rows(0, 4).clone(), std::vector<double>(ref.begin(), ref.begin() + 4 * d),
               "ordinary rows");
  expect_close(y.slice_rows(4, 5).clone(), std::vector<double>(ref.begin() + 4 * d, ref.end()),
               "large mean", 1e-4);
}

TEST_F(Ops, AddRmsNormFusedProducesSumAndNorm) {
  const int64_t d = 24, n = 4;
  const double eps = 1e-6;
  const std::vector<float> a = norm_rows(rng_, d), c = random_floats(rng_, n * d),
                           w = random_floats(rng_, d, 0.5f, 1.5f);
  GraphBuilder b("add_rms");
  const int ai = b.input("a", DType::kF32, {kTokens, Dim::of(d)});
  const int ci = b.input("b", DType::kF32, {kTokens, Dim::of(d)});
  const int sum = b.add(ai, ci, "residual");
  b.output(sum, "sum");
  b.output(b.rms_norm(sum, b.weight("w", f32(w, {d})), eps, "norm"), "normed");
  Graph g = b.finish();
  ASSERT_EQ(fuse_add_rms_norm(g, log_), 1);
  verify_graph(g);
  ASSERT_EQ(g.nodes.size(), 1u);
  ASSERT_EQ(g.nodes[0].op, OpKind::kAddRmsNorm);
  TensorMap out = run(g, {{"a", f32(a, {n, d})}, {"b", f32(c, {n, d})}});
  std::vector<float> s(n * d);
  for (int64_t i = 0; i < n * d; ++i) {
    s[i] = a[i] + c[i];
    EXPECT_EQ(out.at("sum").data<float>()[i], static_cast<float>(double{a[i]} + c[i])) << i;
  }
  expect_close(out.at("normed"), ref_rms_norm(s, w, n, d, eps), "normed");
}

// ---- Cast -----------------------------------------------------------------------------------

// binary16 encoding of f with round-half-to-even, computed from the value in double.
uint16_t ref_f16_bits(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isnan(a)) return sign | 0x7e00;
  if (std::isinf(a)) return sign | 0x7c00;
  int e = 0;
  std::frexp(a, &e);                     // a in [2^(e-1), 2^e)
  const int exp = std::max(e - 1, -14);  // below 2^-14 the spacing stays 2^-24
  const double ulp = std::ldexp(1.0, exp - 10);
  const double q = std::nearbyint(a / ulp);  // default rounding mode: half to even
  const double r = q * ulp;
  if (r >= 65536.0) return sign | 0x7c00;
  if (r < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(q);  // subnormal
  std::frexp(r, &e);
  const int rexp = e - 1;
  const auto mant = static_cast<uint16_t>(std::ldexp(r, 10 - rexp) - 1024.0);
  return sign | static_cast<uint16_t>((rexp + 15) << 10) | mant;
}

bool is_f16_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

TEST_F(Ops, CastF32ToF16AndBack) {
  struct Case {
    float value;
    uint16_t bits;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // clang-format off
  const Case cases[] = {
      {1.0f, 0x3c00},                        {-2.0f, 0xc000},
      {1.0f + 0x1p-11f, 0x3c00},             // tie, rounds to even (down)
      {1.0f + 3 * 0x1p-11f, 0x3c02},         // tie, rounds to even (up)
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},  // just above the tie
      {-0.0f, 0x8000},                       {0.1f, 0x2e66},
      {65504.0f, 0x7bff},                    {65519.0f, 0x7bff},  // largest finite
      {65520.0f, 0x7c00},                    // tie between 65504 and 2^16 rounds to infinity
      {1e9f, 0x7c00},                        {-std::numeric_limits<float>::infinity(), 0xfc00},
      {0x1p-14f, 0x0400},                    // smallest normal
      {0x1p-14f - 0x1p-25f, 0x0400},         // tie: largest subnormal / smallest normal
      {0x1p-24f, 0x0001},                    // smallest subnormal
      {0x1p-25f, 0x0000},                    // tie with zero rounds to even (zero)
      {3 * 0x1p-25f, 0x0002},                // tie between 1 and 2 ulps rounds to 2
      {0x1p-26f, 0x0000},                    {nan, 0x7e00},
  };
  // clang-format on
  std::vector<float> x;
  for (const Case& c : cases) x.push_back(c.value);
  for (float v : random_floats(rng_, 64, -70000.0f, 70000.0f)) x.push_back(v);
  for (float v : random_floats(rng_, 64, -1e-4f, 1e-4f)) x.push_back(v);  // subnormal range
  const int64_t n = static_cast<int64_t>(x.size());
  GraphBuilder b("cast16");
  const int h = b.cast(b.input("x", DType::kF32, {kTokens}), DType::kF16, "to_f16");
  b.output(h, "half");
  b.output(b.cast(h, DType::kF32, "to_f32"), "back");
  const Graph g = b.finish();
  TensorMap out = run(g, {{"x", f32(x, {n})}});
  ASSERT_EQ(out.at("half").dtype(), DType::kF16);
  const auto* bits = static_cast<const uint16_t*>(out.at("half").raw());
  const float* back = out.at("back").data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t want = ref_f16_bits(x[i]);
    if (i < static_cast<int64_t>(std::size(cases))) {
      ASSERT_EQ(want, cases[i].bits) << "test reference disagrees with the table at " << x[i];
    }
    if (is_f16_nan(want)) {
      EXPECT_TRUE(is_f16_nan(bits[i])) << i;
      EXPECT_TRUE(std::isnan(back[i])) << i;
      continue;
    }
    EXPECT_EQ(bits[i], want) << "f16 of " << x[i] << " (0x" << std::hex
                             << std::bit_cast<uint32_t>(x[i]) << ")";
    EXPECT_EQ(static_cast<double>(back[i]), f16_value(want)) << x[i];
  }
}

TEST_F(Ops, CastF32ToBf16RoundsToNearestEven) {
  struct Case {
    uint32_t f32_bits;
    uint16_t bf16_bits;
  };
  // clang-format off
  const Case cases[] = {
      {0x3f800000, 0x3f80}, {0x80000000, 0x8000},  // 1.0, -0.0
      {0x3f808000, 0x3f80},  // tie, even stays
      {0x3f818000, 0x3f82},  // tie, odd rounds up
      {0x3f808001, 0x3f81},  // above the tie
      {0x3f807fff, 0x3f80},  // below the tie
      {0xbf818000, 0xbf82},  // negative tie
      {0x7f7e8000, 0x7f7e},  // tie near the top, even
      {0x7f7f8000, 0x7f80},  // tie at the top rounds to infinity
      {0x7f7fffff, 0x7f80}, {0xff7fffff, 0xff80},  // +-FLT_MAX round to infinity
      {0x00018000, 0x0002},  // subnormal tie, odd rounds up
      {0x80008000, 0x8000},  // negative subnormal tie to (negative) zero
      {0x00000001, 0x0000}, {0xff800000, 0xff80},  // smallest subnormal, -inf
  };
  // clang-format on
  std::vector<float> x;
  for (const Case& c : cases) x.push_back(std::bit_cast<float>(c.f32_bits));
  x.push_back(std::bit_cast<float>(0x7fc00000u));  // quiet NaN
  x.push_back(std::bit_cast<float>(0x7f800001u));  // signalling NaN must stay a NaN
  const int64_t n = static_cast<int64_t>(x.size());
  GraphBuilder b("cast_bf16");
  const int h = b.cast(b.input("x", DType::kF32, {kTokens}), DType::kBF16, "to_bf16");
  b.output(h, "bf16");
  b.output(b.cast(h, DType::kF32, "to_f32"), "back");
  const Graph g = b.finish();
  TensorMap out = run(g, {{"x", f32(x, {n})}});
  const auto* bits = static_cast<const uint16_t*>(out.at("bf16").raw());
  const float* back = out.at("back").data<float>();
  for (size_t i = 0; i < std::size(cases); ++i) {
    EXPECT_EQ(bits[i], cases[i].bf16_bits) << std::hex << "0x" << cases[i].f32_bits;
    EXPECT_EQ(std::bit_cast<uint32_t>(back[i]), static_cast<uint32_t>(cases[i].bf16_bits) << 16)
        << std::hex << "0x" << cases[i].f32_bits;
  }
  for (int64_t i = static_cast<int64_t>(std::size(cases)); i < n; ++i) {
    EXPECT_EQ(bits[i] & 0x7f80, 0x7f80) << i;
    EXPECT_NE(bits[i] & 0x7f, 0) << "NaN became infinity at " << i;
    EXPECT_TRUE(std::isnan(back[i])) << i;
  }
}

// ---- Attention ------------------------------------------------------------------------------

using BiasFn = std::function<double(int h, int64_t qpos, int64_t kpos)>;

// One sequence, in double: queries and keys/values at positions 0.., rows of H*dh floats;
// scores = scale * q.k + bias, softmax, weighted sum of values.
std::vector<double> ref_attention(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, int64_t nq, int64_t nk, int H,
                                  int dh, double scale, bool causal, const BiasFn& bias) {
  const int64_t W = static_cast<int64_t>(H) * dh;
  std::vector<double> out(nq * W, 0.0);
  for (int h = 0; h < H; ++h)
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t visible = causal ? std::min(nk, i + 1) : nk;
      std::vector<double> s(visible);
      double mx = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        double dotp = 0.0;
        for (int d = 0; d < dh; ++d)
          dotp += static_cast<double>(q[i * W + h * dh + d]) * k[j * W + h * dh + d];
        s[j] = scale * dotp + (bias ? bias(h, i, j) : 0.0);
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < visible; ++j)
        for (int d = 0; d < dh; ++d) out[i * W + h * dh + d] += s[j] / sum * v[j * W + h * dh + d];
    }
  return out;
}

// T5 models use bidirectional buckets exactly when attention is not causal.
AttentionAttrs attention_attrs(AttentionKind kind, PositionBias bias, int heads, int head_dim,
                               bool causal, double scale) {
  AttentionAttrs a;
  a.kind = kind;
  a.bias = bias;
  a.num_heads = heads;
  a.head_dim = head_dim;
  a.causal = causal;
  a.scale = static_cast<float>(scale);
  a.bidirectional_buckets = !causal;
  a.num_buckets = 8;
  return a;
}

std::vector<float> rows_of(const std::vector<float>& m, int64_t width, int64_t begin, int64_t end) {
  return std::vector<float>(m.begin() + begin * width, m.begin() + end * width);
}

struct EncoderCase {
  PositionBias bias;
  bool causal;
  double scale;
  std::vector<int64_t> lengths;
};

void check_encoder_attention(Context& ctx, std::mt19937& rng, const EncoderCase& c) {
  const int H = 3, dh = 4, W = H * dh, nb = 8, md = 6;
  int64_t n = 0;
  for (int64_t len : c.lengths) n += len;
  const std::vector<float> q = random_floats(rng, n * W, -2, 2),
                           k = random_floats(rng, n * W, -2, 2), v = random_floats(rng, n * W),
                           table = random_floats(rng, nb * H, -3, 3);
  AttentionAttrs a = attention_attrs(AttentionKind::kEncoderSelf, c.bias, H, dh, c.causal, c.scale);
  a.bidirectional_buckets = true;
  a.max_distance = md;
  GraphBuilder b("encoder_attention");
  const int qi = b.input("q", DType::kF32, {kTokens, Dim::of(W)});
  const int ki = b.input("k", DType::kF32, {kTokens, Dim::of(W)});
  const int vi = b.input("v", DType::kF32, {kTokens, Dim::of(W)});
  const int ti = c.bias == PositionBias::kT5Relative ? b.weight("rel", f32(table, {nb, H})) : -1;
  b.output(b.attention(qi, ki, vi, ti, a, "attn"), "y");
  const Graph g = b.finish();
  AttentionBatch batch;
  int64_t begin = 0;
  for (int64_t len : c.lengths) {
    batch.seqs.push_back(SequenceSlot{begin, len, 0, {}, nullptr});
    begin += len;
  }
  const Tensor y =
      make_cpu_backend(ctx)
          ->compile(g)
          ->execute({{"q", f32(q, {n, W})}, {"k", f32(k, {n, W})}, {"v", f32(v, {n, W})}}, &batch)
          .at("y");
  BiasFn bias;
  if (c.bias == PositionBias::kT5Relative)
    bias = [&](int h, int64_t qp, int64_t kp) {
      return static_cast<double>(table[t5_relative_bucket(kp - qp, true, nb, md) * H + h]);
    };
  begin = 0;
  for (size_t s = 0; s < c.lengths.size(); ++s) {
    const int64_t len = c.lengths[s];
    expect_close(
        y.slice_rows(begin, begin + len).clone(),
        ref_attention(rows_of(q, W, begin, begin + len), rows_of(k, W, begin, begin + len),
                      rows_of(v, W, begin, begin + len), len, len, H, dh, c.scale, c.causal, bias),
        "sequence " + std::to_string(s));
    begin += len;
  }
}

TEST_F(Ops, AttentionEncoderSelfT5RelativeBias) {
  // Lengths past max_distance so both the log-spaced and the clamped buckets are used.
  check_encoder_attention(ctx_, rng_, {PositionBias::kT5Relative, false, 1.0, {9, 4}});
}

TEST_F(Ops, AttentionEncoderSelfCausalScaledNoBias) {
  check_encoder_attention(ctx_, rng_, {PositionBias::kNone, true, 0.5, {3, 6, 1}});
}

struct CachedCase {
  bool packed;
  PositionBias bias;
  std::vector<std::vector<int64_t>> steps;  // tokens per sequence in each step
};

// Runs several steps of cached self attention (block size 2, layer 1 of 2) over a ragged batch,
// then compares every position's output to full causal attention over the whole sequence.
void check_cached_attention(Context& ctx, std::mt19937& rng, const CachedCase& c) {
  const int H = 6, dh = 4, W = H * dh, nb = 8, md = 10;
  const size_t S = c.steps[0].size();
  std::vector<int64_t> lengths(S, 0);
  for (const auto& step : c.steps)
    for (size_t s = 0; s < S; ++s) lengths[s] += step[s];
  // BLOOM scales by 1/sqrt(dh); T5 does not scale.
  AttentionAttrs a = attention_attrs(AttentionKind::kCachedSelf, c.bias, H, dh, true,
                                     c.bias == PositionBias::kAlibi ? 0.5 : 1.0);
  a.layer = 1;
  a.packed_qkv = c.packed;
  a.max_distance = md;
  const std::vector<float> table = random_floats(rng, nb * H, -3, 3);
  GraphBuilder b("cached_attention");
  int qi, ki = -1, vi = -1;
  if (c.packed) {
    qi = b.input("qkv", DType::kF32, {kTokens, Dim::of(3 * W)});
  } else {
    qi = b.input("q", DType::kF32, {kTokens, Dim::of(W)});
    ki = b.input("k", DType::kF32, {kTokens, Dim::of(W)});
    vi = b.input("v", DType::kF32, {kTokens, Dim::of(W)});
  }
  const int ti = c.bias == PositionBias::kT5Relative ? b.weight("rel", f32(table, {nb, H})) : -1;
  b.output(b.attention(qi, ki, vi, ti, a, "attn"), "y");
  const Graph g = b.finish();
  std::unique_ptr<Executable> exe = make_cpu_backend(ctx)->compile(g);

  std::vector<std::vector<float>> Q(S), K(S), V(S), got(S);
  for (size_t s = 0; s < S; ++s) {
    Q[s] = random_floats(rng, lengths[s] * W, -2, 2);
    K[s] = random_floats(rng, lengths[s] * W, -2, 2);
    V[s] = random_floats(rng, lengths[s] * W);
    got[s].assign(lengths[s] * W, NAN);
  }
  PagedKvCache cache(2, W, /*block_size=*/2);
  std::vector<SequenceKv> kv(S);
  for (size_t step = 0; step < c.steps.size(); ++step) {
    std::vector<size_t> order;
    for (size_t s = 0; s < S; ++s) order.push_back(step % 2 ? S - 1 - s : s);
    for (size_t s : order) kv[s].prepare_append(cache, c.steps[step][s]);
    AttentionBatch batch;
    batch.cache = &cache;
    std::vector<float> q, k, v, qkv;
    int64_t begin = 0;
    for (size_t s : order) {
      const int64_t past = kv[s].length(), len = c.steps[step][s];
      batch.seqs.push_back(SequenceSlot{begin, len, past, kv[s].blocks(), nullptr});
      begin += len;
      for (int64_t p = past; p < past + len; ++p) {
        for (auto* dst : {&q, &k, &v}) {
          const std::vector<float>& src = dst == &q ? Q[s] : dst == &k ? K[s] : V[s];
          dst->insert(dst->end(), src.begin() + p * W, src.begin() + (p + 1) * W);
          qkv.insert(qkv.end(), src.begin() + p * W, src.begin() + (p + 1) * W);  // [3, H, dh]
        }
      }
    }
    TensorMap in;
    if (c.packed)
      in["qkv"] = f32(qkv, {begin, 3 * W});
    else
      in = {{"q", f32(q, {begin, W})}, {"k", f32(k, {begin, W})}, {"v", f32(v, {begin, W})}};
    const Tensor y = exe->execute(in, &batch).at("y");
    for (size_t i = 0; i < order.size(); ++i) {
      const size_t s = order[i];
      const SequenceSlot& slot = batch.seqs[i];
      std::memcpy(got[s].data() + slot.past_len * W, y.data<float>() + slot.token_begin * W,
                  slot.num_tokens * W * sizeof(float));
    }
    for (size_t s = 0; s < S; ++s) kv[s].commit(c.steps[step][s]);
  }
  EXPECT_GT(cache.blocks_in_use(), 4) << "the sequences should span several blocks";
  // HF build_alibi_tensor for 6 heads: 4 slopes of base 2^-2, then 2 interleaved of base 2^-1.
  const double slopes[6] = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
  BiasFn bias;
  if (c.bias == PositionBias::kAlibi)
    bias = [&](int h, int64_t, int64_t kp) { return slopes[h] * static_cast<double>(kp); };
  if (c.bias == PositionBias::kT5Relative)
    bias = [&](int h, int64_t qp, int64_t kp) {
      return static_cast<double>(table[t5_relative_bucket(kp - qp, false, nb, md) * H + h]);
    };
  for (size_t s = 0; s < S; ++s) {
    const std::vector<double> ref =
        ref_attention(Q[s], K[s], V[s], lengths[s], lengths[s], H, dh, a.scale, true, bias);
    expect_close(f32(got[s], {lengths[s] * W}), ref, "sequence " + std::to_string(s));
    kv[s].release(cache);
  }
}

TEST_F(Ops, AttentionCachedSelfAlibiPackedRaggedPrefillThenDecode) {
  // Prefill 4 and 3 tokens in one batch, then one token each twice (6 heads: ALiBi's
  // non-power-of-two slopes).
  check_cached_attention(ctx_, rng_, {true, PositionBias::kAlibi, {{4, 3}, {1, 1}, {1, 1}}});
}

TEST_F(Ops, AttentionCachedSelfT5CausalBucketsRaggedPrefillThenDecode) {
  // Past max_distance (10) so the clamped causal bucket is used.
  check_cached_attention(ctx_, rng_, {false, PositionBias::kT5Relative, {{11, 3}, {1, 1}}});
}

TEST_F(Ops, AttentionCrossUsesTheSequencesCrossKvOfItsLayer) {
  const int H = 3, dh = 4, W = H * dh;
  const std::vector<int64_t> enc_len = {5, 2}, dec_len = {3, 1};
  CrossKv cross[2];
  std::vector<std::vector<float>> keys(2), vals(2);
  for (int s = 0; s < 2; ++s) {
    for (int layer = 0; layer < 2; ++layer) {
      const std::vector<float> kk = random_floats(rng_, enc_len[s] * W, -2, 2),
                               vv = random_floats(rng_, enc_len[s] * W);
      cross[s].keys.push_back(f32(kk, {enc_len[s], W}));
      cross[s].values.push_back(f32(vv, {enc_len[s], W}));
      if (layer == 1) {
        keys[s] = kk;
        vals[s] = vv;
      }
    }
  }
  AttentionAttrs a = attention_attrs(AttentionKind::kCross, PositionBias::kNone, H, dh, false, 0.7);
  a.layer = 1;
  GraphBuilder b("cross");
  b.output(b.attention(b.input("q", DType::kF32, {kTokens, Dim::of(W)}), -1, -1, -1, a, "attn"),
           "y");
  const Graph g = b.finish();
  const int64_t n = dec_len[0] + dec_len[1];
  const std::vector<float> q = random_floats(rng_, n * W, -2, 2);
  AttentionBatch batch;
  batch.seqs.push_back(SequenceSlot{0, dec_len[0], 0, {}, &cross[0]});
  batch.seqs.push_back(SequenceSlot{dec_len[0], dec_len[1], 4, {}, &cross[1]});
  const Tensor y = run(g, {{"q", f32(q, {n, W})}}, &batch).at("y");
  int64_t begin = 0;
  for (int s = 0; s < 2; ++s) {
    expect_close(y.slice_rows(begin, begin + dec_len[s]).clone(),
                 ref_attention(rows_of(q, W, begin, begin + dec_len[s]), keys[s], vals[s],
                               dec_len[s], enc_len[s], H, dh, a.scale, false, nullptr),
                 "sequence " + std::to_string(s));
    begin += dec_len[s];
  }
}

TEST_F(Ops, BadInputAttentionBatchLayout) {
  GraphBuilder b("attn");
  const int q = b.input("q", DType::kF32, {kTokens, Dim::of(4)});
  b.output(
      b.attention(q, q, q, -1,
                  attention_attrs(AttentionKind::kCachedSelf, PositionBias::kNone, 2, 2, true, 1.0),
                  "attn"),
      "y");
  const Graph g = b.finish();
  const TensorMap in{{"q", f32(random_floats(rng_, 12), {3, 4})}};
  EXPECT_THROW(run(g, in, nullptr), Error) << "no batch layout";
  PagedKvCache cache(1, 4, 2);
  SequenceKv kv;
  kv.prepare_append(cache, 2);  // one block: room for two of the three tokens
  AttentionBatch batch;
  batch.seqs.push_back(SequenceSlot{0, 3, 0, kv.blocks(), nullptr});
  EXPECT_THROW(run(g, in, &batch), Error) << "no KV cache";
  batch.cache = &cache;
  EXPECT_THROW(run(g, in, &batch), Error) << "block table too short";
  batch.seqs[0].num_tokens = 2;
  EXPECT_THROW(run(g, in, &batch), Error) << "layout covers 2 of 3 tokens";
  kv.release(cache);
}

// ---- Batch invariance -----------------------------------------------------------------------

// x -> Linear (packed qkv) -> cached ALiBi attention -> Linear, BLOOM-like.
TEST_F(Ops, BatchedResultsAreBitwiseIdenticalToAlone) {
  const int H = 4, dh = 4, W = H * dh;
  AttentionAttrs a =
      attention_attrs(AttentionKind::kCachedSelf, PositionBias::kAlibi, H, dh, true, 0.5);
  a.packed_qkv = true;
  GraphBuilder b("block");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(W)});
  const int qkv = b.linear(x, b.weight("w_qkv", f32(random_floats(rng_, 3 * W * W), {3 * W, W})),
                           b.weight("b_qkv", f32(random_floats(rng_, 3 * W), {3 * W})), "qkv");
  const int attn = b.attention(qkv, -1, -1, -1, a, "attn");
  b.output(b.linear(attn, b.weight("w_o", f32(random_floats(rng_, W * W), {W, W})), -1, "o"), "y");
  Graph g = b.finish();
  plan_memory(g, log_, {{"tokens", 16}});
  std::unique_ptr<Executable> exe = make_cpu_backend(ctx_)->compile(g);

  const std::vector<int64_t> lengths = {3, 5, 7};  // sequence 1 is the one checked
  std::vector<std::vector<float>> xs;
  for (int64_t len : lengths) xs.push_back(random_floats(rng_, (len + 1) * W, -2, 2));
  // Runs prefill then one decode step of the given sequences; returns sequence 1's outputs.
  auto run_sequences = [&](const std::vector<size_t>& which) {
    PagedKvCache cache(1, W, 2);
    std::vector<SequenceKv> kv(lengths.size());
    std::vector<float> result;
    for (int step = 0; step < 2; ++step) {
      AttentionBatch batch;
      batch.cache = &cache;
      std::vector<float> in;
      int64_t begin = 0, mine = -1, my_len = 0;
      for (size_t s : which) {
        const int64_t len = step == 0 ? lengths[s] : 1, past = kv[s].length();
        kv[s].prepare_append(cache, len);
        batch.seqs.push_back(SequenceSlot{begin, len, past, kv[s].blocks(), nullptr});
        in.insert(in.end(), xs[s].begin() + past * W, xs[s].begin() + (past + len) * W);
        if (s == 1) mine = begin, my_len = len;
        begin += len;
      }
      const Tensor y = exe->execute({{"x", f32(in, {begin, W})}}, &batch).at("y");
      result.insert(result.end(), y.data<float>() + mine * W,
                    y.data<float>() + (mine + my_len) * W);
      for (size_t s : which) kv[s].commit(step == 0 ? lengths[s] : 1);
    }
    for (SequenceKv& k : kv) k.release(cache);
    return result;
  };
  const std::vector<float> alone = run_sequences({1});
  const std::vector<float> batched = run_sequences({0, 1, 2});
  const std::vector<float> reordered = run_sequences({2, 1, 0});
  ASSERT_EQ(alone.size(), static_cast<size_t>((lengths[1] + 1) * W));
  ASSERT_EQ(batched.size(), alone.size());
  ASSERT_EQ(reordered.size(), alone.size());
  EXPECT_EQ(std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(alone.data(), reordered.data(), alone.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace kiln
