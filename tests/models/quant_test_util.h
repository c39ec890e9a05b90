// Helpers of the quantization tests (sensitivity fallback, AWQ): a copy of t5-tiny with outlier
// channels made on purpose, the fixture calibration prompts, and dev-set exact matches.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "io/calibration_prompts.h"
#include "io/jsonl.h"
#include "io/safetensors.h"
#include "parity_util.h"
#include "runtime/compiled_model.h"
#include "runtime/scheduler.h"

namespace kiln::test {

namespace quant_fs = std::filesystem;

inline std::string temp_dir(const std::string& name) {
  const quant_fs::path dir =
      quant_fs::path(KILN_TEST_TMP) / (name + "_" + std::to_string(getpid()));
  quant_fs::create_directories(dir);
  return dir.string();
}

// t5-tiny with every fourth channel of encoder block 1's (or `blocks`') attention norm multiplied
// by `factor` and the same input columns of its q, k and v weights divided by it: the same fp32
// model, whose q/k/v input has a quarter of its channels `factor` times larger than the rest
// (too many for calibration to clip: the scale covers them, and the other channels get a level
// or two).
inline std::string outlier_t5(float factor, const std::vector<int>& blocks = {1}) {
  std::string name = fmt::format("outlier_t5_{:g}", factor);
  for (int b : blocks) name += "_" + std::to_string(b);
  const std::string dir = temp_dir(name);
  for (const auto& entry : quant_fs::directory_iterator(fixture("t5-tiny")))
    if (entry.path().filename() != "model.safetensors")
      quant_fs::copy_file(entry.path(), quant_fs::path(dir) / entry.path().filename(),
                          quant_fs::copy_options::overwrite_existing);
  std::map<std::string, Tensor> tensors;
  const SafetensorsFile source = SafetensorsFile::open(fixture("t5-tiny/model.safetensors"));
  for (const auto& [name, t] : source.tensors()) tensors[name] = t.to_f32().clone();
  for (int b : blocks) {
    const std::string prefix = "encoder.block." + std::to_string(b) + ".layer.0.";
    float* gamma = tensors.at(prefix + "layer_norm.weight").data<float>();
    const int64_t width = tensors.at(prefix + "layer_norm.weight").numel();
    for (int64_t c = 0; c < width; c += 4) gamma[c] *= factor;
    for (const char* m : {"q", "k", "v"}) {
      Tensor& w = tensors.at(prefix + "SelfAttention." + m + ".weight");
      const int64_t rows = w.dim(0), cols = w.dim(1);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; c += 4) w.data<float>()[r * cols + c] /= factor;
    }
  }
  write_safetensors(dir + "/model.safetensors", tensors);
  return dir;
}

inline std::vector<CalibrationPrompt> calib_prompts(size_t n) {
  std::vector<CalibrationPrompt> all = read_calibration_prompts(fixture("data/calib.jsonl"));
  all.resize(std::min(n, all.size()));
  return all;
}

// Exact-match answers on every `every`-th dev row, generated greedily as `kiln eval` does.
inline int dev_exact_matches(CompiledModel& m, size_t every) {
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::string> answers;
  size_t i = 0;
  read_jsonl(fixture("data/dev.jsonl"), [&](const nlohmann::json& j, int) {
    if (i++ % every != 0) return;
    ids.push_back(m.tokenizer().encode(
        apply_prompt_template(m.model().prompt_template, j.at("prompt").get<std::string>())));
    answers.push_back(j.at("answer").get<std::string>());
  });
  GenerationParams p = default_generation_params(m.desc());
  p.num_beams = 1;
  p.max_new_tokens = 32;
  SchedulerOptions so;
  so.max_batch = 16;
  Scheduler s(m, so);
  int n = 0;
  const std::vector<GenerationResult> out = s.generate(ids, p);
  for (size_t r = 0; r < out.size(); ++r) {
    std::string text = m.tokenizer().decode(out[r].output_ids);
    const size_t b = text.find_first_not_of(' '), e = text.find_last_not_of(' ');
    text = b == std::string::npos ? "" : text.substr(b, e - b + 1);
    n += text == answers[r];
  }
  return n;
}

}  // namespace kiln::test
