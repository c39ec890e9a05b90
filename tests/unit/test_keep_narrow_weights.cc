// keep_narrow_weights (passes/pass.h): a CUDA fp16/bf16 plan built from a checkpoint of its own
// type reads the checkpoint's tensors without widening them to f32 and back, and its graph and
// weights are those of a build from the same checkpoint widened to f32 beforehand (the path
// with no Cast to fold at all).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "../models/parity_util.h"
#include "backend/cuda_info.h"
#include "builder/builder.h"
#include "io/safetensors.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;
const Logger kQuiet(LogLevel::kSilent);

// A copy of fixture model `model` whose float tensors are stored as `dtype`.
std::string converted_copy(const std::string& model, DType dtype) {
  const fs::path dir =
      fs::path(KILN_TEST_TMP) /
      ("narrow_" + model + "_" + std::string(dtype_name(dtype)) + "_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(fixture(model)))
    if (entry.path().filename() != "model.safetensors")
      fs::copy_file(entry.path(), dir / entry.path().filename(),
                    fs::copy_options::overwrite_existing);
  std::map<std::string, Tensor> tensors;
  const SafetensorsFile source = SafetensorsFile::open(fixture(model + "/model.safetensors"));
  for (const auto& [name, t] : source.tensors())
    tensors[name] = dtype_traits(t.dtype()).is_float ? t.to(dtype) : t.clone();
  write_safetensors((dir / "model.safetensors").string(), tensors);
  return dir.string();
}

ModelIR build_cuda(const std::string& dir, Precision precision) {
  BuildOptions o;
  o.device = Device::kCuda;
  o.precision = precision;
  return build_model(dir, o, kQuiet);
}

// The two plans have the same nodes (ops, attributes' kinds, in order) and every node's weight
// inputs hold the same dtype, shape and bytes.
void expect_same_plan(const ModelIR& a, const ModelIR& b) {
  ASSERT_EQ(a.graphs.size(), b.graphs.size());
  for (size_t gi = 0; gi < a.graphs.size(); ++gi) {
    const Graph& ga = a.graphs[gi];
    const Graph& gb = b.graphs[gi];
    ASSERT_EQ(ga.nodes.size(), gb.nodes.size()) << ga.name;
    int weights = 0;
    for (size_t i = 0; i < ga.nodes.size(); ++i) {
      const Node& na = ga.nodes[i];
      const Node& nb = gb.nodes[i];
      ASSERT_EQ(na.op, nb.op) << ga.name << " node " << i << " " << na.name;
      ASSERT_EQ(na.inputs.size(), nb.inputs.size()) << na.name;
      for (size_t k = 0; k < na.inputs.size(); ++k) {
        if (na.inputs[k] < 0) continue;
        const Value& va = ga.values[na.inputs[k]];
        const Value& vb = gb.values[nb.inputs[k]];
        ASSERT_EQ(va.kind, vb.kind) << na.name << " input " << k;
        EXPECT_EQ(va.dtype, vb.dtype) << na.name << " input " << k;
        if (va.kind != ValueKind::kWeight) continue;
        ASSERT_EQ(va.data.shape(), vb.data.shape()) << va.name;
        ASSERT_EQ(va.data.dtype(), vb.data.dtype()) << va.name;
        EXPECT_EQ(std::memcmp(va.data.raw(), vb.data.raw(), va.data.nbytes()), 0) << va.name;
        ++weights;
      }
    }
    EXPECT_GT(weights, 0) << ga.name;
  }
}

TEST(KeepNarrowWeights, Fp16CheckpointToFp16PlanReadsTheCheckpointAndMatchesTheF32Path) {
  if (!query_cuda().compiled) GTEST_SKIP() << "built without CUDA: cuda plans cannot be built";
  // bloom-tiny is stored in fp16: the Linears whose weights no pass rewrote (those with no folded
  // norm: the attention output and FFN output projections) read the checkpoint's mapping.
  const ModelIR direct = build_cuda(fixture("bloom-tiny"), Precision::kFp16);
  int mapped = 0, plain = 0;
  for (const Graph& g : direct.graphs)
    for (const Node& n : g.nodes)
      if (n.op == OpKind::kLinear && !n.attr<LinearAttrs>().epilogue.norm) {
        ++plain;
        mapped += g.values[n.inputs[1]].data.file_backed();
      }
  EXPECT_GT(plain, 0);
  EXPECT_EQ(mapped, plain) << "a Linear weight of an fp16 plan is a copy of the fp16 checkpoint's";
  expect_same_plan(direct, build_cuda(converted_copy("bloom-tiny", DType::kF32), Precision::kFp16));
}

TEST(KeepNarrowWeights, Bf16T5MatchesTheF32PathInBf16AndKeepsWoWideInFp16) {
  if (!query_cuda().compiled) GTEST_SKIP() << "built without CUDA: cuda plans cannot be built";
  const std::string bf16 = converted_copy("t5-tiny", DType::kBF16);
  // The f32 widening of the bf16 tensors is exact: both checkpoints hold the same numbers.
  const std::string wide = fs::path(KILN_TEST_TMP) / ("narrow_t5_wide_" + std::to_string(getpid()));
  {
    fs::create_directories(wide);
    for (const auto& entry : fs::directory_iterator(bf16))
      if (entry.path().filename() != "model.safetensors")
        fs::copy_file(entry.path(), fs::path(wide) / entry.path().filename(),
                      fs::copy_options::overwrite_existing);
    std::map<std::string, Tensor> tensors;
    const SafetensorsFile source = SafetensorsFile::open(bf16 + "/model.safetensors");
    for (const auto& [name, t] : source.tensors())
      tensors[name] = dtype_traits(t.dtype()).is_float ? t.to_f32() : t.clone();
    write_safetensors(wide + "/model.safetensors", tensors);
  }
  expect_same_plan(build_cuda(bf16, Precision::kBf16), build_cuda(wide, Precision::kBf16));
  // An fp16 plan of a bf16 checkpoint widens through Casts (no kept weights) and still keeps
  // T5's FFN output projections in f32: the same plan as from the f32 numbers.
  const ModelIR fp16 = build_cuda(bf16, Precision::kFp16);
  expect_same_plan(fp16, build_cuda(wide, Precision::kFp16));
  int wide_wo = 0;
  for (const Graph& g : fp16.graphs)
    for (const Node& n : g.nodes)
      if (n.op == OpKind::kLinear && n.name.find(".wo") != std::string::npos)
        wide_wo += g.values[n.inputs[1]].dtype == DType::kF32;
  EXPECT_GT(wide_wo, 0);
}

}  // namespace
}  // namespace kiln::test
