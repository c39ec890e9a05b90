// The ONNX interpreter's arithmetic kernels, one op at a time (onnx_op_harness.h: each case runs
// with run-time inputs and folded, which must agree). Expected values are worked out by hand
// from ONNX's operator specification (numpy broadcasting, truncating integer division, ...).
#include "frontend/onnx/interp/kernels.h"
#include "frontend/onnx/supported_ops.h"
#include "onnx_op_harness.h"

namespace kiln {
namespace {

using namespace onnx_test;
constexpr OnnxElemType kF = OnnxElemType::kFloat;
constexpr OnnxElemType kI = OnnxElemType::kInt64;
constexpr OnnxElemType kB = OnnxElemType::kBool;

// Every op the import reads has a kernel: a graph that imports also runs.
TEST(OnnxInterpKernels, EverySupportedOpHasAKernel) {
  for (std::string_view op : supported_onnx_ops()) {
    const OpKernel* k = find_op_kernel(op);
    ASSERT_NE(k, nullptr) << op;
    EXPECT_EQ(k->op, op);
  }
  EXPECT_EQ(find_op_kernel("NonMaxSuppression"), nullptr);
  EXPECT_EQ(find_op_kernel(""), nullptr);
}

TEST(OnnxInterpBinary, AddBroadcastsTrailingAndBothWays) {
  // [2, 3] + [3]: the row adds to each row.
  expect_tensor(run_op1({"Add", {f32({2, 3}, {1, 2, 3, 4, 5, 6}), f32({3}, {10, 20, 30})}}), kF,
                {2, 3}, {11, 22, 33, 14, 25, 36});
  // [2, 1] + [1, 3] -> [2, 3]: an outer sum.
  expect_tensor(run_op1({"Add", {f32({2, 1}, {1, 2}), f32({1, 3}, {10, 20, 30})}}), kF, {2, 3},
                {11, 21, 31, 12, 22, 32});
  // A scalar broadcast to [2, 2, 1].
  expect_tensor(run_op1({"Add", {i64({2, 2, 1}, {1, 2, 3, 4}), i64({}, {100})}}), kI, {2, 2, 1},
                {101, 102, 103, 104});
}

TEST(OnnxInterpBinary, SubMulDiv) {
  expect_tensor(run_op1({"Sub", {i64({2}, {5, 7}), i64({}, {2})}}), kI, {2}, {3, 5});
  expect_tensor(run_op1({"Mul", {f32({2, 2}, {1, 2, 3, 4}), f32({2, 1}, {10, -1})}}), kF, {2, 2},
                {10, 20, -3, -4});
  expect_tensor(run_op1({"Div", {f32({2}, {1, 3}), f32({2}, {4, 2})}}), kF, {2}, {0.25, 1.5});
  // Integer division truncates toward zero (C's, onnxruntime's), not toward -inf.
  expect_tensor(run_op1({"Div", {i64({4}, {7, -7, 6, -9}), i64({4}, {2, 2, -4, -3})}}), kI, {4},
                {3, -3, -1, 3});
  expect_tensor(run_op1({"Div", {i32({2}, {7, -8}), i32({}, {3})}}), OnnxElemType::kInt32, {2},
                {2, -2});
}

TEST(OnnxInterpBinary, IntegerArithmeticWraps) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  expect_tensor(run_op1({"Add", {i64({1}, {big}), i64({1}, {1})}}), kI, {1},
                {static_cast<double>(std::numeric_limits<int64_t>::min())});
}

TEST(OnnxInterpBinary, HalfPrecisionComputesInFloatAndKeepsItsType) {
  // 1.5 * 2 = 3 and 2 * 0.25 = 0.5 are exact in float16; 0.1 + 0.2 rounds to float16's nearest
  // (0.2998046875 = 307 / 1024).
  expect_tensor(run_op1({"Mul", {f16({2}, {1.5f, 2}), f16({2}, {2, 0.25f})}}),
                OnnxElemType::kFloat16, {2}, {3, 0.5}, 0);
  expect_tensor(run_op1({"Add", {f16({1}, {0.1f}), f16({1}, {0.2f})}}), OnnxElemType::kFloat16, {1},
                {307.0 / 1024}, 0);
}

TEST(OnnxInterpBinary, Pow) {
  expect_tensor(run_op1({"Pow", {f32({3}, {2, 3, 4}), f32({}, {2})}}), kF, {3}, {4, 9, 16});
  // The exponent may have another type than the base; the result has the base's.
  expect_tensor(run_op1({"Pow", {f32({3}, {2, 3, 4}), i64({1}, {3})}}), kF, {3}, {8, 27, 64});
  expect_tensor(run_op1({"Pow", {f32({2}, {4, 9}), f32({2}, {0.5f, -1})}}), kF, {2}, {2, 1.0 / 9});
  expect_tensor(run_op1({"Pow", {i64({3}, {2, 3, -2}), i64({}, {3})}}), kI, {3}, {8, 27, -8});
}

TEST(OnnxInterpBinary, MaxAndMinTakeAnyNumberOfInputs) {
  const std::vector<ImportTensor> in = {f32({3}, {1, 5, 3}), f32({3}, {4, 2, 6}), f32({}, {3.5f})};
  expect_tensor(run_op1({"Max", in}), kF, {3}, {4, 5, 6});
  expect_tensor(run_op1({"Min", in}), kF, {3}, {1, 2, 3});
  expect_tensor(run_op1({"Max", {i64({2}, {-1, 7})}}), kI, {2}, {-1, 7});
  // Broadcast across the inputs: [2, 1] with [2].
  expect_tensor(run_op1({"Min", {i64({2, 1}, {0, 10}), i64({2}, {5, -5})}}), kI, {2, 2},
                {0, -5, 5, -5});
  expect_tensor(run_op1({"Max", {f32({1}, {NAN}), f32({1}, {1})}}), kF, {1}, {NAN});
}

TEST(OnnxInterpBinary, Comparisons) {
  const std::vector<ImportTensor> in = {f32({3}, {1, 2, 3}), f32({}, {2})};
  expect_tensor(run_op1({"Equal", in}), kB, {3}, {0, 1, 0});
  expect_tensor(run_op1({"Greater", in}), kB, {3}, {0, 0, 1});
  expect_tensor(run_op1({"GreaterOrEqual", in}), kB, {3}, {0, 1, 1});
  expect_tensor(run_op1({"Less", in}), kB, {3}, {1, 0, 0});
  expect_tensor(run_op1({"LessOrEqual", in}), kB, {3}, {1, 1, 0});
  expect_tensor(run_op1({"Equal", {i64({2, 1}, {1, 2}), i64({2}, {1, 2})}}), kB, {2, 2},
                {1, 0, 0, 1});
  expect_tensor(run_op1({"Equal", {boolean({2}, {1, 0}), boolean({2}, {1, 1})}}), kB, {2}, {1, 0});
}

TEST(OnnxInterpBinary, AndNotWhere) {
  expect_tensor(run_op1({"And", {boolean({4}, {1, 1, 0, 0}), boolean({4}, {1, 0, 1, 0})}}), kB, {4},
                {1, 0, 0, 0});
  expect_tensor(run_op1({"Not", {boolean({2}, {1, 0})}}), kB, {2}, {0, 1});
  // condition [2, 1], X [2], Y a scalar: [[X], [Y]].
  expect_tensor(run_op1({"Where", {boolean({2, 1}, {1, 0}), f32({2}, {1, 2}), f32({}, {9})}}), kF,
                {2, 2}, {1, 2, 9, 9});
  expect_tensor(
      run_op1({"Where", {boolean({3}, {0, 1, 0}), i64({3}, {1, 2, 3}), i64({3}, {-1, -2, -3})}}),
      kI, {3}, {-1, 2, -3});
}

TEST(OnnxInterpUnary, MathFunctions) {
  expect_tensor(run_op1({"Abs", {f32({2}, {-1.5f, 2})}}), kF, {2}, {1.5, 2});
  expect_tensor(run_op1({"Abs", {i64({2}, {-3, 4})}}), kI, {2}, {3, 4});
  expect_tensor(run_op1({"Neg", {f32({2}, {1, -2})}}), kF, {2}, {-1, 2});
  expect_tensor(run_op1({"Neg", {i64({1}, {5})}}), kI, {1}, {-5});
  expect_tensor(run_op1({"Relu", {f32({3}, {-1, 0, 0.5f})}}), kF, {3}, {0, 0, 0.5});
  expect_tensor(run_op1({"Sqrt", {f32({2}, {4, 2.25f})}}), kF, {2}, {2, 1.5});
  expect_tensor(run_op1({"Reciprocal", {f32({3}, {4, -0.5f, 8})}}), kF, {3}, {0.25, -2, 0.125});
  expect_tensor(run_op1({"Log", {f32({2}, {1, static_cast<float>(M_E)})}}), kF, {2}, {0, 1});
  // tanh(1) and erf(1), erf(-0.5) from tables of the functions.
  expect_tensor(run_op1({"Tanh", {f32({2}, {0, 1})}}), kF, {2}, {0, 0.7615941559557649});
  expect_tensor(run_op1({"Erf", {f32({3}, {0, 1, -0.5f})}}), kF, {3},
                {0, 0.8427007929497149, -0.5204998778130465});
}

TEST(OnnxInterpCast, BetweenTypes) {
  auto cast = [](ImportTensor x, OnnxElemType to) {
    return run_op1({"Cast", {std::move(x)}, {attr_int("to", static_cast<int64_t>(to))}});
  };
  // float -> int truncates toward zero.
  expect_tensor(cast(f32({3}, {1.7f, -1.7f, 0}), kI), kI, {3}, {1, -1, 0});
  expect_tensor(cast(f32({3}, {1.7f, -0.5f, 0}), kB), kB, {3}, {1, 1, 0});
  expect_tensor(cast(i64({2}, {3, -4}), kF), kF, {2}, {3, -4});
  expect_tensor(cast(boolean({2}, {1, 0}), kF), kF, {2}, {1, 0});
  expect_tensor(cast(boolean({2}, {1, 0}), kI), kI, {2}, {1, 0});
  // Integers narrow modulo 2^bits: 300 = 256 + 44, -129 = -256 + 127.
  expect_tensor(cast(i64({2}, {300, -129}), OnnxElemType::kInt8), OnnxElemType::kInt8, {2},
                {44, 127});
  // float16's nearest to 0.1 is 1638 / 16384 = 0.0999755859375.
  expect_tensor(cast(f32({2}, {0.1f, 65504}), OnnxElemType::kFloat16), OnnxElemType::kFloat16, {2},
                {0.0999755859375, 65504}, 0);
  expect_tensor(cast(f16({1}, {-2.5f}), kF), kF, {1}, {-2.5});
  expect_tensor(cast(i64({1}, {7}), kI), kI, {1}, {7});
}

// double is held as float: a float16 or float widened to double is exactly a float; from an
// integer it is refused (2^53 > 2^24: digits could be lost).
TEST(OnnxInterpCast, ToDoubleFromFloatTypesOnly) {
  const int64_t to_double = static_cast<int64_t>(OnnxElemType::kDouble);
  expect_tensor(run_op1({"Cast", {f16({2}, {65504, -0.5f})}, {attr_int("to", to_double)}}), kF, {2},
                {65504, -0.5}, 0);
  expect_tensor(run_op1({"Cast", {f32({1}, {0.1f})}, {attr_int("to", to_double)}}), kF, {1},
                {static_cast<double>(0.1f)}, 0);
  expect_op_error({"Cast", {i64({1}, {3})}, {attr_int("to", to_double)}},
                  {"Cast to double is taken from float, float16 or bfloat16 only", "int64"});
}

TEST(OnnxInterpUnary, IsInfBothSignsOrOne) {
  const float inf = std::numeric_limits<float>::infinity();
  const ImportTensor x = f32({4}, {inf, -inf, 65504, std::nanf("")});
  expect_tensor(run_op1({"IsInf", {x}}), kB, {4}, {1, 1, 0, 0});
  expect_tensor(run_op1({"IsInf", {x}, {attr_int("detect_negative", 0)}}), kB, {4}, {1, 0, 0, 0});
  expect_tensor(run_op1({"IsInf", {x}, {attr_int("detect_positive", 0)}}), kB, {4}, {0, 1, 0, 0});
  // float16 is widened first: its infinity is float's.
  expect_tensor(run_op1({"IsInf", {f16({2}, {inf, 1})}}), kB, {2}, {1, 0});
  expect_op_error({"IsInf", {i64({1}, {1})}}, {"IsInf takes float tensors, got int64"});
}

TEST(OnnxInterpUnary, ClipBetweenOptionalBounds) {
  const ImportTensor x = f32({5}, {-3, -1, 0, 2, 9});
  expect_tensor(run_op1({"Clip", {x, f32({}, {-1}), f32({}, {2})}}), kF, {5}, {-1, -1, 0, 2, 2});
  // Only a max (min absent: an empty input name), only a min, neither.
  expect_tensor(run_op1({"Clip", {x, omitted(), f32({}, {1})}}), kF, {5}, {-3, -1, 0, 1, 1});
  expect_tensor(run_op1({"Clip", {x, f32({}, {0})}}), kF, {5}, {0, 0, 0, 2, 9});
  expect_tensor(run_op1({"Clip", {x}}), kF, {5}, {-3, -1, 0, 2, 9});
  // min above max: max everywhere (min(max(x, lo), hi)); NaN stays NaN; integers too.
  expect_tensor(run_op1({"Clip", {x, f32({}, {5}), f32({}, {4})}}), kF, {5}, {4, 4, 4, 4, 4});
  const ImportTensor y = run_op1({"Clip", {f32({1}, {std::nanf("")}), f32({}, {0}), f32({}, {1})}});
  EXPECT_TRUE(std::isnan(y.to_floats()[0]));
  expect_tensor(run_op1({"Clip", {i64({3}, {-5, 5, 50}), i64({}, {0}), i64({}, {10})}}), kI, {3},
                {0, 5, 10});
  // HF T5's fp16 clamp: its bound 65504 - 1000 is 64512 in float16 (spacing 32 there), which
  // 65504 is clipped to.
  expect_tensor(run_op1({"Clip", {f16({2}, {65504, -1}), f16({}, {-64504}), f16({}, {64504})}}),
                OnnxElemType::kFloat16, {2}, {64512, -1}, 0);
  expect_op_error({"Clip", {x, f32({2}, {0, 1})}}, {"Clip's min must be a scalar, got shape [2]"});
  expect_op_error({"Clip", {x, i64({}, {0})}}, {"Clip's min is int64, its input float"});
}

TEST(OnnxInterpMatMul, MatricesVectorsAndBatches) {
  const ImportTensor a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  const ImportTensor b = f32({3, 2}, {7, 8, 9, 10, 11, 12});
  expect_tensor(run_op1({"MatMul", {a, b}}), kF, {2, 2}, {58, 64, 139, 154});
  // 1-d operands: a dimension is added, then removed from the result.
  expect_tensor(run_op1({"MatMul", {f32({3}, {1, 2, 3}), b}}), kF, {2}, {58, 64});
  expect_tensor(run_op1({"MatMul", {a, f32({3}, {1, 1, 1})}}), kF, {2}, {6, 15});
  expect_tensor(run_op1({"MatMul", {f32({3}, {1, 2, 3}), f32({3}, {4, 5, 6})}}), kF, {}, {32});
  // Batch [2] with b broadcast: [1, 2] · [5, 6]ᵀ = 17, [3, 4] · [5, 6]ᵀ = 39.
  expect_tensor(run_op1({"MatMul", {f32({2, 1, 2}, {1, 2, 3, 4}), f32({2, 1}, {5, 6})}}), kF,
                {2, 1, 1}, {17, 39});
  // Batch dimensions broadcast both ways: [2, 1] x [1, 2] -> [2, 2] batches of 1x1 products.
  expect_tensor(run_op1({"MatMul", {f32({2, 1, 1, 1}, {2, 3}), f32({1, 2, 1, 1}, {10, 100})}}), kF,
                {2, 2, 1, 1}, {20, 200, 30, 300});
  expect_tensor(run_op1({"MatMul", {i64({1, 2}, {2, 3}), i64({2, 1}, {4, 5})}}), kI, {1, 1}, {23});
}

TEST(OnnxInterpMatMul, GemmTransposesScalesAndAddsC) {
  const ImportTensor a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  const ImportTensor bt = f32({2, 3}, {7, 9, 11, 8, 10, 12});  // Bᵀ of [[7, 8], [9, 10], [11, 12]]
  // 2 * [[58, 64], [139, 154]] + 0.5 * [2, 4]
  expect_tensor(
      run_op1({"Gemm",
               {a, bt, f32({2}, {2, 4})},
               {attr_int("transB", 1), attr_float("alpha", 2), attr_float("beta", 0.5f)}}),
      kF, {2, 2}, {117, 130, 279, 310});
  const ImportTensor at = f32({3, 2}, {1, 4, 2, 5, 3, 6});
  expect_tensor(
      run_op1({"Gemm", {at, f32({3, 2}, {7, 8, 9, 10, 11, 12})}, {attr_int("transA", 1)}}), kF,
      {2, 2}, {58, 64, 139, 154});
  // C of [2, 1] broadcast along the columns.
  expect_tensor(
      run_op1({"Gemm", {f32({2, 1}, {1, 2}), f32({1, 2}, {3, 4}), f32({2, 1}, {10, 20})}}), kF,
      {2, 2}, {13, 14, 26, 28});
}

TEST(OnnxInterpNormalize, Softmax) {
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0);
  const double s = e1 + e2 + e3;
  expect_tensor(run_op1({"Softmax", {f32({1, 3}, {1, 2, 3})}}), kF, {1, 3},
                {e1 / s, e2 / s, e3 / s});
  // axis 0 of [[1, 2], [1, 4]]: column 0 equal, column 1 e^2 : e^4.
  expect_tensor(run_op1({"Softmax", {f32({2, 2}, {1, 2, 1, 4})}, {attr_int("axis", -2)}}), kF,
                {2, 2}, {0.5, 1 / (1 + std::exp(2.0)), 0.5, 1 / (1 + std::exp(-2.0))});
}

TEST(OnnxInterpNormalize, LayerNormalizationWithStatistics) {
  // Rows [1, 3] (mean 2, variance 1) and [2, 2] (mean 2, variance 0); scale [1, 2], bias [0, 1].
  const double inv1 = 1 / std::sqrt(1 + 1e-5), inv0 = 1 / std::sqrt(1e-5);
  const std::vector<ImportTensor> out =
      run_op({"LayerNormalization",
              {f32({2, 2}, {1, 3, 2, 2}), f32({2}, {1, 2}), f32({2}, {0, 1})},
              {},
              3});
  expect_tensor(out[0], kF, {2, 2}, {-inv1, 2 * inv1 + 1, 0, 1}, 1e-5);
  expect_tensor(out[1], kF, {2, 1}, {2, 2});
  expect_tensor(out[2], kF, {2, 1}, {inv1, inv0}, 1e-5);
  // axis 0: all four elements are one group (mean 2, variance 0.5); no bias.
  const double inv = 1 / std::sqrt(0.5 + 1e-5);
  expect_tensor(run_op1({"LayerNormalization",
                         {f32({2, 2}, {1, 3, 2, 2}), f32({2, 2}, {1, 1, 1, 1})},
                         {attr_int("axis", 0)}}),
                kF, {2, 2}, {-inv, inv, 0, 0}, 1e-5);
}

TEST(OnnxInterpNormalize, ReduceMeanAxesAttributeThenInput) {
  const ImportTensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  // Opsets 13-17: axes is an attribute.
  expect_tensor(run_op1({"ReduceMean", {x}, {attr_ints("axes", {1})}, 1, 17}), kF, {2, 1}, {2, 5});
  expect_tensor(
      run_op1({"ReduceMean", {x}, {attr_ints("axes", {-1}), attr_int("keepdims", 0)}, 1, 13}), kF,
      {2}, {2, 5});
  // Opset 18: an input.
  expect_tensor(run_op1({"ReduceMean", {x, i64({1}, {-2})}, {attr_int("keepdims", 0)}, 1, 18}), kF,
                {3}, {2.5, 3.5, 4.5});
  // No axes: every axis (either opset), unless noop_with_empty_axes (18).
  expect_tensor(run_op1({"ReduceMean", {x}, {}, 1, 18}), kF, {1, 1}, {3.5});
  expect_tensor(run_op1({"ReduceMean", {x}, {}, 1, 17}), kF, {1, 1}, {3.5});
  expect_tensor(run_op1({"ReduceMean", {x}, {attr_int("noop_with_empty_axes", 1)}, 1, 18}), kF,
                {2, 3}, {1, 2, 3, 4, 5, 6});
  // Both axes of a [2, 2, 2]: means of (0, 1, 4, 5) and (2, 3, 6, 7) over axes 0 and 2.
  expect_tensor(
      run_op1(
          {"ReduceMean", {f32({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7})}, {attr_ints("axes", {0, 2})}}),
      kF, {1, 2, 1}, {2.5, 4.5});
  // Integer means truncate: (1 + 2) / 2 = 1.
  expect_tensor(run_op1({"ReduceMean", {i64({2}, {1, 2})}, {}, 1, 18}), kI, {1}, {1});
}

TEST(OnnxInterpNormalize, ReduceSumAxesInputFromOpset13) {
  const ImportTensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_tensor(run_op1({"ReduceSum", {x, i64({1}, {1})}, {}, 1, 13}), kF, {2, 1}, {6, 15});
  expect_tensor(run_op1({"ReduceSum", {x, i64({1}, {0})}, {attr_int("keepdims", 0)}, 1, 13}), kF,
                {3}, {5, 7, 9});
  // No axes: the sum of all (HF T5's isinf(h).any() as a sum of int64 flags), unless
  // noop_with_empty_axes.
  expect_tensor(
      run_op1({"ReduceSum", {i64({2, 2}, {0, 1, 1, 0})}, {attr_int("keepdims", 0)}, 1, 17}), kI, {},
      {2});
  expect_tensor(run_op1({"ReduceSum", {x}, {attr_int("noop_with_empty_axes", 1)}, 1, 13}), kF,
                {2, 3}, {1, 2, 3, 4, 5, 6});
  expect_op_error({"ReduceSum", {x}, {attr_ints("axes", {1})}, 1, 13},
                  {"ReduceSum takes axes as an input from opset 13 on"});
}

TEST(OnnxInterpNormalize, ReduceMeanRefusesTheOtherOpsetsForm) {
  const ImportTensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_op_error({"ReduceMean", {x}, {attr_ints("axes", {1})}, 1, 18},
                  {"ReduceMean takes axes as an input from opset 18 on"});
  expect_op_error({"ReduceMean", {x, i64({1}, {1})}, {}, 1, 17},
                  {"takes axes as an attribute before opset 18"});
}

TEST(OnnxInterpScan, CumSumExclusiveAndReverse) {
  const ImportTensor x = f32({4}, {1, 2, 3, 4});
  const ImportTensor axis = i64({}, {0});
  expect_tensor(run_op1({"CumSum", {x, axis}}), kF, {4}, {1, 3, 6, 10});
  expect_tensor(run_op1({"CumSum", {x, axis}, {attr_int("exclusive", 1)}}), kF, {4}, {0, 1, 3, 6});
  expect_tensor(run_op1({"CumSum", {x, axis}, {attr_int("reverse", 1)}}), kF, {4}, {10, 9, 7, 4});
  expect_tensor(run_op1({"CumSum", {x, axis}, {attr_int("exclusive", 1), attr_int("reverse", 1)}}),
                kF, {4}, {9, 7, 4, 0});
  // 2-d, a negative int32 axis (rows), then axis 0 (columns); int64 data (BLOOM's positions).
  const ImportTensor m = i64({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_tensor(run_op1({"CumSum", {m, i32({}, {-1})}}), kI, {2, 3}, {1, 3, 6, 4, 9, 15});
  expect_tensor(run_op1({"CumSum", {m, i64({1}, {0})}}), kI, {2, 3}, {1, 2, 3, 5, 7, 9});
}

TEST(OnnxInterpScan, TriluUpperLowerAndK) {
  const ImportTensor x = f32({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  expect_tensor(run_op1({"Trilu", {x}}), kF, {3, 3}, {1, 2, 3, 0, 5, 6, 0, 0, 9});
  expect_tensor(run_op1({"Trilu", {x, i64({}, {1})}}), kF, {3, 3}, {0, 2, 3, 0, 0, 6, 0, 0, 0});
  expect_tensor(run_op1({"Trilu", {x}, {attr_int("upper", 0)}}), kF, {3, 3},
                {1, 0, 0, 4, 5, 0, 7, 8, 9});
  expect_tensor(run_op1({"Trilu", {x, i64({}, {-1})}, {attr_int("upper", 0)}}), kF, {3, 3},
                {0, 0, 0, 4, 0, 0, 7, 8, 0});
  // Not square: [2, 3] lower with k = 1 keeps columns <= row + 1.
  expect_tensor(
      run_op1({"Trilu", {i64({2, 3}, {1, 2, 3, 4, 5, 6}), i64({}, {1})}, {attr_int("upper", 0)}}),
      kI, {2, 3}, {1, 2, 0, 4, 5, 6});
  // Batched, bool (the causal masks exporters build): each [2, 2] matrix's upper triangle.
  expect_tensor(run_op1({"Trilu", {boolean({2, 2, 2}, {1, 1, 1, 1, 1, 0, 1, 1})}}), kB, {2, 2, 2},
                {1, 1, 0, 1, 1, 0, 0, 1});
  // A k beyond the matrix keeps nothing (upper) or everything (lower).
  expect_tensor(run_op1({"Trilu", {x, i64({}, {5})}}), kF, {3, 3}, std::vector<double>(9, 0));
}

}  // namespace
}  // namespace kiln
