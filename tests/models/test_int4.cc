// int4-weight plans on both fixture models beyond what every precision is checked for
// (test_precision.cc: greedy ids against HuggingFace, logits against fp32, plan round trip,
// batching): the next token each position would choose, teacher-forced on HuggingFace's greedy
// sequences, agrees with HuggingFace's fp32 choice on nearly every position; and a plan whose
// int4 tensors are damaged (scales missing, of another type or shape, a wrong packing) is refused
// with a message naming what is wrong.
#include <gtest/gtest.h>

#include <filesystem>

#include "backend/cuda_info.h"
#include "builder/builder.h"
#include "damaged_plan.h"
#include "graph/packing.h"
#include "model_runner.h"
#include "parity_util.h"
#include "plan/plan.h"

namespace kiln::test {
namespace {

int64_t argmax_row(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

struct AgreementCase {
  std::string dir;
  // Fraction of teacher-forced positions whose argmax equals HuggingFace's fp32 argmax.
  double min_top1;
  Device device = Device::kCpu;  // CUDA: int4 weights with fp16 activations (skipped without a GPU)
};

class Int4Agreement : public testing::TestWithParam<AgreementCase> {};

// Teacher-forced top-1 agreement is what greedy generation needs position by position, without
// one early flip hiding every later position (as comparing whole generated sequences does).
TEST_P(Int4Agreement, NextTokenChoicesAgreeWithHuggingFaceFp32) {
  if (GetParam().device == Device::kCuda)
    if (const std::string why = no_gpu_reason(); !why.empty()) GTEST_SKIP() << why;
  Context ctx(ContextOptions{LogLevel::kWarning, 2});
  BuildOptions build;
  build.precision = Precision::kInt4Weight;
  build.device = GetParam().device;
  auto engine = compile_model_dir(ctx, fixture(GetParam().dir), build);
  const SafetensorsFile ref =
      SafetensorsFile::open(fixture(GetParam().dir + "/reference.safetensors"));
  int64_t positions = 0, agree = 0;
  for (int c = 0; ref.tensors().count("case" + std::to_string(c) + ".input_ids"); ++c) {
    const std::string k = "case" + std::to_string(c);
    const std::vector<int64_t> prompt = ids_of(ref.tensors().at(k + ".input_ids"));
    std::vector<int64_t> seq = ids_of(ref.tensors().at(k + ".greedy_ids"));
    seq.pop_back();
    const Tensor got = run_forward(*engine, prompt, seq, false).logits;
    const Tensor want = ref.tensors().at(k + ".logits").to_f32();
    ASSERT_EQ(got.shape(), want.shape()) << k;
    const int64_t vocab = want.dim(-1);
    for (int64_t p = 0; p < want.numel() / vocab; ++p) {
      agree += argmax_row(got.data<float>() + p * vocab, vocab) ==
               argmax_row(want.data<float>() + p * vocab, vocab);
      ++positions;
    }
  }
  const double rate = static_cast<double>(agree) / static_cast<double>(positions);
  std::cout << "  [" << GetParam().dir << " " << device_name(GetParam().device)
            << " int4-weight: top-1 agrees with HF fp32 on " << agree << " of " << positions
            << " positions (" << rate << ")]\n";
  EXPECT_GT(positions, 50);
  EXPECT_GE(rate, GetParam().min_top1);
}

INSTANTIATE_TEST_SUITE_P(Models, Int4Agreement,
                         // Measured: t5 59 of 59, bloom 234 of 235. A position can flip only
                         // where HF's two best logits are closer than int4's error there (a few
                         // percent of the logits' range: test_precision.cc); 98 % allows one such
                         // near-tie in 50 positions, and fails as soon as int4 moves clear
                         // decisions.
                         // CUDA's int4 plans (fp16 activations) are held to the same.
                         testing::Values(AgreementCase{"t5-tiny", 0.98},
                                         AgreementCase{"bloom-tiny", 0.98},
                                         AgreementCase{"t5-tiny", 0.98, Device::kCuda},
                                         AgreementCase{"bloom-tiny", 0.98, Device::kCuda}),
                         [](const testing::TestParamInfo<AgreementCase>& info) {
                           return std::string(info.param.dir == "t5-tiny" ? "t5" : "bloom") +
                                  (info.param.device == Device::kCuda ? "_cuda" : "");
                         });

// A plan whose i4 weight lost its group scales, carries scales of the wrong type or shape, or is
// labelled with a packing no i4 kernel reads is refused when read, naming the problem.
TEST(BadInputInt4Plan, DamagedInt4TensorsAreRefused) {
  Context ctx(ContextOptions{LogLevel::kError, 1});
  BuildOptions options;
  options.precision = Precision::kInt4Weight;
  const ModelIR built = build_model(fixture("bloom-tiny"), options, ctx.log());
  std::filesystem::create_directories(KILN_TEST_TMP);
  const std::string path = std::string(KILN_TEST_TMP) + "/int4_bad.plan";
  auto first_i4 = [](Graph& g) -> Node& {
    return *std::find_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) {
      return n.op == OpKind::kLinear && g.values[n.inputs[1]].dtype == DType::kI4;
    });
  };
  auto expect_refused = [&](auto&& damage, const std::string& what, const std::string& word) {
    expect_damaged_plan_refused(built, path, ctx.log(), damage, what, word);
  };
  expect_refused([&](Graph& g) { first_i4(g).inputs.resize(3); }, "no group scales", "scales");
  expect_refused(
      [&](Graph& g) {
        Node& n = first_i4(g);
        Value& s = g.values[n.inputs[3]];
        g.set_weight_data(n.inputs[3], s.data.to_f32());
        s.dtype = DType::kF32;
      },
      "f32 group scales", "f16");
  expect_refused(
      [&](Graph& g) {
        Node& n = first_i4(g);
        Value& s = g.values[n.inputs[3]];
        const Tensor shorter = s.data.clone().slice_rows(0, s.data.dim(0) - 1).clone();
        g.set_weight_data(n.inputs[3], shorter);
        s.shape = {Dim::of(shorter.dim(0)), Dim::of(shorter.dim(1))};
      },
      "group scales of another length", "scales");
  // An i4 weight labelled with the i8 weights' packing (a layout no i4 kernel reads).
  expect_refused([&](Graph& g) { g.values[first_i4(g).inputs[1]].layout = panel16_layout(); },
                 "i4 weight packed as panel16", "i4");
  // An i4 weight whose scales belong to another i4 weight of a different width.
  expect_refused(
      [&](Graph& g) {
        Node& a = first_i4(g);
        for (Node& n : g.nodes)
          if (n.op == OpKind::kLinear && g.values[n.inputs[1]].dtype == DType::kI4 &&
              g.values[n.inputs[3]].data.dim(1) != g.values[a.inputs[3]].data.dim(1)) {
            a.inputs[3] = n.inputs[3];
            return;
          }
        ADD_FAILURE() << "no two i4 weights of different widths";
      },
      "another weight's group scales", "scales");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln::test
