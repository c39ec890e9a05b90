// Frontend behaviour beyond the fixtures: half-precision checkpoints are widened exactly, and
// sharded checkpoints import like single files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

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

// The same checkpoint split into three shards behind model.safetensors.index.json (as
// transformers' save_pretrained writes large models) builds the same model: bit-identical logits
// and the same greedy ids.
TEST(Frontend, ShardedCheckpointImportsLikeTheSingleFile) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  for (const char* model : {"t5-tiny", "bloom-tiny"}) {
    const std::string dir = std::string(KILN_TEST_TMP) + "/sharded-" + model;
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(fixture(model))) {
      const std::string name = e.path().filename().string();
      if (name != "model.safetensors" && name.find("reference") == std::string::npos)
        fs::copy_file(e.path(), dir + "/" + name);
    }
    const SafetensorsFile src =
        SafetensorsFile::open(fixture(std::string(model) + "/model.safetensors"));
    std::map<std::string, Tensor> shards[3];
    nlohmann::json weight_map = nlohmann::json::object();
    int i = 0;
    for (const auto& [n, t] : src.tensors()) {
      const int s = i++ % 3;
      shards[s][n] = t;
      weight_map[n] = fmt::format("model-{:05d}-of-00003.safetensors", s + 1);
    }
    for (int s = 0; s < 3; ++s)
      write_safetensors(fmt::format("{}/model-{:05d}-of-00003.safetensors", dir, s + 1), shards[s]);
    std::ofstream(dir + "/model.safetensors.index.json")
        << nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
    ASSERT_FALSE(fs::exists(dir + "/model.safetensors"));

    auto single = compile_model_dir(ctx, fixture(model));
    auto sharded = compile_model_dir(ctx, dir);
    const bool t5 = single->desc().encoder_decoder;
    const std::vector<int64_t> prompt =
        single->tokenizer().encode("reverse: suvogi" + std::string(t5 ? "" : " ="));
    const std::vector<int64_t> dec = t5 ? std::vector<int64_t>{0, 159, 154} : prompt;
    const Forward a = run_forward(*single, prompt, dec, false);
    const Forward b = run_forward(*sharded, prompt, dec, false);
    EXPECT_EQ(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.nbytes()), 0) << model;
    Scheduler ga(*single), gb(*sharded);
    EXPECT_EQ(ga.generate({prompt}, GenerationParams{})[0].output_ids,
              gb.generate({prompt}, GenerationParams{})[0].output_ids)
        << model;
  }
}

}  // namespace
}  // namespace kiln::test
