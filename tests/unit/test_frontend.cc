// Frontend behaviour beyond the fixtures: half-precision checkpoints are widened exactly, and
// sharded checkpoints import like single files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "../models/model_runner.h"
#include "../models/parity_util.h"
#include "builder/builder.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

// A copy of t5-tiny whose weights are stored as `dtype` (or, for as_f32, rounded through `dtype`
// and stored back as f32).
std::string make_t5_copy(const std::string& name, DType dtype, bool as_f32) {
  const std::string dir = std::string(KILN_TEST_TMP) + "/" + name;
  fs::create_directories(dir);
  for (const char* f : {"config.json", "spiece.model"})
    fs::copy_file(fixture("t5-tiny/") + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  const SafetensorsFile src = SafetensorsFile::open(fixture("t5-tiny/model.safetensors"));
  std::map<std::string, Tensor> out;
  for (const auto& [n, t] : src.tensors()) {
    const Tensor narrow = t.to(dtype);
    out[n] = as_f32 ? narrow.to_f32() : narrow;
  }
  write_safetensors(dir + "/model.safetensors", out);
  return dir;
}

TEST(Frontend, HalfPrecisionT5CheckpointsAreWidenedExactly) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const std::string name(dtype_name(dt));
    auto half = compile_model_dir(ctx, make_t5_copy("t5-" + name, dt, false));
    auto rounded = compile_model_dir(ctx, make_t5_copy("t5-" + name + "-f32", dt, true));
    const std::vector<int64_t> prompt = half->tokenizer().encode("reverse: suvogi");
    const Forward a = run_forward(*half, prompt, {0, 159, 154, 55}, false);
    const Forward b = run_forward(*rounded, prompt, {0, 159, 154, 55}, false);
    EXPECT_EQ(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.nbytes()), 0) << name;
    for (const Graph& g : half->model().graphs) {
      for (const Value& v : g.values) {
        if (v.kind == ValueKind::kWeight) {
          EXPECT_EQ(v.dtype, DType::kF32) << v.name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln::test
