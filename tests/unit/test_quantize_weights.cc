// The i4 format and its quantizer (core/dtype.h, passes/quantize_weights.h): nibbles in the
// documented order, group scales of m / -8 in f16, values within half a step of the weights
// (one step for the opposite extreme, which clamps to 7), zero groups, a last group shorter
// than 128, and the precision pass's choices and reasons in an int4-weight graph.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/half.h"
#include "graph/builder.h"
#include "graph/verifier.h"
#include "passes/pass.h"
#include "passes/quantize_weights.h"

namespace kiln {
namespace {

TEST(Int4Format, NibblesAreTwosComplementLowNibbleFirst) {
  const std::vector<float> v = {-8, 7, -1, 0, 3, -3, 5.5f, -9};
  Tensor q = Tensor::empty(DType::kI4, {2, 4});
  ASSERT_EQ(q.nbytes(), 4u);
  dtype_traits(DType::kI4).from_float(v.data(), q.raw(), v.size());
  const auto* b = static_cast<const uint8_t*>(q.raw());
  EXPECT_EQ(b[0], 0x78);  // -8 = 0x8 low, 7 high
  EXPECT_EQ(b[1], 0x0F);  // -1 = 0xF low, 0 high
  EXPECT_EQ(b[2], 0xD3);  // 3 low, -3 = 0xD high
  EXPECT_EQ(b[3], 0x86);  // 5.5 rounds to even 6; -9 clamps to -8
  const Tensor back = q.to_f32();
  EXPECT_EQ(std::vector<float>(back.data<float>(), back.data<float>() + 8),
            (std::vector<float>{-8, 7, -1, 0, 3, -3, 6, -8}));
  EXPECT_THROW(dtype_bytes(DType::kI4, 7), Error);
}

// Rows of 200 (a last group of 72) with a zero group and groups of every sign: each value within
// half a step |scale| of its weight, except a value of the opposite sign at the extreme's
// magnitude (clamped to 7: within one step); the extreme itself exact up to the scale's f16
// rounding; scales = f16(m / -8).
TEST(Int4Format, GroupQuantizationRoundTripsWithinHalfAStep) {
  const int64_t rows = 5, cols = 200, groups = 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 0.05f);
  std::vector<float> w(rows * cols);
  for (float& x : w) x = dist(rng);
  for (int64_t i = 128; i < 200; ++i) w[1 * cols + i] = 0.f;  // row 1, group 1: zeros
  w[2 * cols + 3] = 0.5f;                                     // row 2, group 0: extreme +0.5
  w[2 * cols + 7] = -0.5f;                                    // ... and its opposite
  const Tensor wt = Tensor::from_vector(w, {rows, cols});
  Tensor q, scales;
  quantize_groups_int4(wt, &q, &scales);
  ASSERT_EQ(q.dtype(), DType::kI4);
  ASSERT_EQ(scales.dtype(), DType::kF16);
  ASSERT_EQ(scales.shape(), (Shape{rows, groups}));
  const Tensor back = dequantize_groups_int4(q, scales);
  const auto* s = static_cast<const uint16_t*>(scales.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      float m = 0.f;
      for (int64_t i = g * 128; i < std::min(cols, (g + 1) * 128); ++i)
        if (std::fabs(w[r * cols + i]) > std::fabs(m)) m = w[r * cols + i];
      const float scale = fp16_to_float(s[r * groups + g]);
      EXPECT_EQ(s[r * groups + g], m == 0.f ? 0 : float_to_fp16(m / -8.f)) << r << " " << g;
      for (int64_t i = g * 128; i < std::min(cols, (g + 1) * 128); ++i) {
        const float want = w[r * cols + i], got = back.data<float>()[r * cols + i];
        const bool clamped = want * m < 0 && std::fabs(want) > 7.5f * std::fabs(scale);
        EXPECT_LE(std::fabs(got - want), (clamped ? 1.0f : 0.5f) * std::fabs(scale) * 1.001f)
            << "row " << r << " col " << i;
        if (want == m) {
          EXPECT_EQ(got, -8.f * scale);
        }
      }
    }
  EXPECT_EQ(back.data<float>()[1 * cols + 150], 0.f);
  EXPECT_EQ(s[1 * groups + 1], 0);
  EXPECT_EQ(back.data<float>()[2 * cols + 3], 0.5f);
  EXPECT_NEAR(back.data<float>()[2 * cols + 7], -0.4375f, 1e-6);  // clamped to 7 · (-0.0625)
  EXPECT_NE(int4_refused(Tensor::from_vector<float>({1, 2, 3}, {1, 3})), "");
  EXPECT_NE(int4_refused(Tensor::from_vector<float>({1e6f, 0}, {1, 2})), "");
  EXPECT_EQ(int4_refused(wt), "");
}

// int4-weight on a hand-made graph: the Linear becomes i4 with f16 group scales, the tied
// table (an Embedding and the logits Linear) and a Linear of an odd width stay int8, each with
// its reason.
TEST(Int4Format, PrecisionPassKeepsTablesLogitsAndOddWidthsInt8) {
  GraphBuilder b("g");
  const int ids = b.input("ids", DType::kI64, {Dim::sym("tokens")});
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  auto random = [&](Shape shape) {
    std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
    for (float& x : v) x = dist(rng);
    return Tensor::from_vector(v, shape);
  };
  const int table = b.weight("table", random({10, 6}));
  const int x = b.embedding(table, ids, "embed");
  const int h = b.linear(x, b.weight("fc.w", random({6, 6})), -1, "fc");
  const int odd = b.linear(h, b.weight("odd.w", random({5, 6})), -1, "odd");
  b.output(odd, "odd");
  b.output(b.linear(h, table, -1, "lm_head"), "logits");
  Graph g = b.finish();
  std::vector<PrecisionNote> notes;
  assign_precision(g, precision_support(Device::kCpu, Precision::kInt4Weight), {}, &notes,
                   Logger(LogLevel::kError));
  verify_graph(g);
  auto weight_of = [&](const std::string& node) -> const Value& {
    for (const Node& n : g.nodes)
      if (n.name == node) return g.values[n.inputs[n.op == OpKind::kLinear ? 1 : 0]];
    throw std::runtime_error(node);
  };
  EXPECT_EQ(weight_of("fc").dtype, DType::kI4);
  EXPECT_EQ(weight_of("odd").dtype, DType::kI4);  // 6 inputs: even
  EXPECT_EQ(weight_of("lm_head").dtype, DType::kI8);
  EXPECT_EQ(weight_of("embed").dtype, DType::kI8);
  auto reason = [&](const std::string& weight) {
    for (const PrecisionNote& n : notes)
      if (n.weight == weight) return n.reason;
    return std::string();
  };
  EXPECT_NE(reason("table").find("Embedding"), std::string::npos) << reason("table");
  EXPECT_EQ(reason("fc.w"), "");
  // An odd input width cannot be i4 (two elements a byte).
  GraphBuilder b2("g2");
  const int in = b2.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(5)});
  const int w5 = b2.weight("w5", random({4, 5}));
  b2.output(b2.linear(in, w5, -1, "fc5"), "y");
  Graph g2 = b2.finish();
  std::vector<PrecisionNote> notes2;
  assign_precision(g2, precision_support(Device::kCpu, Precision::kInt4Weight), {}, &notes2,
                   Logger(LogLevel::kError));
  EXPECT_EQ(g2.values[w5].dtype, DType::kI8);
  ASSERT_EQ(notes2.size(), 1u);
  EXPECT_NE(notes2[0].reason.find("odd"), std::string::npos) << notes2[0].reason;
}

}  // namespace
}  // namespace kiln
