// HF's logits processors (repetition penalty, n-gram bans, bad words, suppressed and forced
// tokens, minimum lengths) against HuggingFace's own ids: tests/data/hf_generation/reference.json,
// made by make_reference.py beside it with transformers on the GPU machine (fp32). Every case is
// checked in greedy search, beam search (4 beams) and sampling at temperature 0.01 (where HF's
// draw is its greedy choice, so the ids must be equal too: this checks that the processors run
// on the sampling path, before the temperature and top-k), on the CPU (fp32 and, forced to the
// AVX2 kernels, the same) and on CUDA (fp32; skipped without a GPU). All of a model's cases run
// in one scheduler, batched, so that rows with different processors share steps.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "builder/builder.h"
#include "parity_util.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

using nlohmann::json;

json load_reference() {
  std::ifstream in(std::string(KILN_SOURCE_DIR) + "/tests/data/hf_generation/reference.json");
  return json::parse(in);
}

// A case's generation parameters: the mode's, then the setting's (HF's names and meaning).
GenerationParams params_of(const json& c, int64_t max_new) {
  GenerationParams p;
  p.max_new_tokens = max_new;
  const std::string mode = c.at("mode");
  if (mode == "beam4") {
    p.num_beams = 4;
    p.early_stopping = EarlyStopping::kHeuristic;
  } else if (mode == "sample") {
    p.do_sample = true;
    p.temperature = 0.01f;
    p.top_k = 50;
    p.top_p = 1.0f;
    p.seed = 1234;
  }
  for (const auto& [key, v] : c.at("setting").items()) {
    if (key == "repetition_penalty") {
      p.repetition_penalty = v.get<float>();
    } else if (key == "no_repeat_ngram_size") {
      p.no_repeat_ngram_size = v.get<int>();
    } else if (key == "encoder_no_repeat_ngram_size") {
      p.encoder_no_repeat_ngram_size = v.get<int>();
    } else if (key == "bad_words_ids") {
      p.bad_words_ids = v.get<std::vector<std::vector<int64_t>>>();
    } else if (key == "suppress_tokens") {
      p.suppress_tokens = v.get<std::vector<int64_t>>();
    } else if (key == "min_new_tokens") {
      p.min_new_tokens = v.get<int64_t>();
    } else if (key == "min_length") {
      p.min_length = v.get<int64_t>();
    } else if (key == "forced_bos_token_id") {
      p.forced_bos_token_id = v.get<int64_t>();
    } else if (key == "forced_eos_token_id") {
      p.forced_eos_token_ids = {v.get<int64_t>()};
    } else if (key == "max_new_tokens") {
      p.max_new_tokens = v.get<int64_t>();
    } else {
      ADD_FAILURE() << "the reference has a setting this test does not know: " << key;
    }
  }
  return p;
}

struct ProcessorCase {
  std::string model;
  Device device;
  bool avx2 = false;  // the CPU backend's AVX2 kernels, whatever the machine has
};

class HfProcessors : public testing::TestWithParam<ProcessorCase> {};

TEST_P(HfProcessors, IdsMatchHuggingFaceInGreedyBeamAndSampling) {
  const ProcessorCase& pc = GetParam();
  if (pc.device == Device::kCuda)
    if (const std::string why = no_gpu_reason(); !why.empty()) GTEST_SKIP() << why;
  ContextOptions co{LogLevel::kWarning, 2};
  co.cpu_isa = pc.avx2 ? CpuIsa::kAvx2 : best_cpu_isa(detect_cpu_features());
  Context ctx(co);
  BuildOptions options;
  options.device = pc.device;
  const auto engine = compile_model_dir(ctx, fixture(pc.model), options);
  const json ref = load_reference();
  const json& cases = ref.at("models").at(pc.model).at("cases");
  const int64_t max_new = ref.at("max_new_tokens");
  ASSERT_GE(cases.size(), 200u);
  SchedulerOptions so;
  so.max_batch = 16;
  Scheduler gen(*engine, so);
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_FALSE(cases[i].contains("error")) << cases[i].dump();
    index[gen.submit(cases[i].at("input_ids").get<std::vector<int64_t>>(),
                     params_of(cases[i], max_new))] = i;
  }
  std::vector<std::optional<std::vector<int64_t>>> got(cases.size());
  size_t done = 0;
  while (done < cases.size())
    for (GenerationEvent& e : gen.step()) {
      if (!e.finished) continue;
      ASSERT_TRUE(e.error.empty()) << e.error;
      got[index.at(e.id)] = e.result.output_ids;
      ++done;
    }
  int mismatches = 0;
  std::map<std::string, int> per_mode;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int64_t> want = cases[i].at("output_ids");
    ++per_mode[cases[i].at("mode").get<std::string>()];
    if (*got[i] == want) continue;
    ++mismatches;
    ADD_FAILURE() << pc.model << " " << cases[i].at("prompt") << " " << cases[i].at("mode") << " "
                  << cases[i].at("setting").dump() << ": kiln " << json(*got[i]).dump() << ", HF "
                  << json(want).dump();
  }
  EXPECT_EQ(mismatches, 0);
  for (const char* mode : {"greedy", "beam4", "sample"}) EXPECT_GT(per_mode[mode], 30) << mode;
}

INSTANTIATE_TEST_SUITE_P(Models, HfProcessors,
                         testing::Values(ProcessorCase{"t5-tiny", Device::kCpu},
                                         ProcessorCase{"bloom-tiny", Device::kCpu},
                                         ProcessorCase{"t5-tiny", Device::kCpu, true},
                                         ProcessorCase{"bloom-tiny", Device::kCpu, true},
                                         ProcessorCase{"t5-tiny", Device::kCuda},
                                         ProcessorCase{"bloom-tiny", Device::kCuda}),
                         [](const testing::TestParamInfo<ProcessorCase>& info) {
                           std::string name = info.param.model + "_" +
                                              std::string(device_name(info.param.device)) +
                                              (info.param.avx2 ? "_avx2" : "");
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace kiln::test
