// Every released plan format version keeps a tiny plan in tests/data/plans/v<N>/. Each must load
// with today's kiln (or be refused with the rebuild message once its version is retired) and run
// exactly like a plan built now from the same checkpoint (tests/data/micro-bloom).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../models/model_runner.h"
#include "builder/builder.h"
#include "plan/plan.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

const std::string kData = std::string(KILN_SOURCE_DIR) + "/tests/data";

TEST(PlanCompat, EveryKeptVersionLoadsAndMatchesAFreshBuild) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  BuildOptions options;
  options.prompt_template = "{prompt} =";
  auto fresh = compile_model_dir(ctx, kData + "/micro-bloom", options);
  int versions = 0, current = 0;
  for (const auto& dir : std::filesystem::directory_iterator(kData + "/plans")) {
    const std::string plan = dir.path().string() + "/micro-bloom.plan";
    ASSERT_TRUE(std::filesystem::exists(plan)) << plan;
    ++versions;
    const uint32_t version =
        static_cast<uint32_t>(std::stoul(dir.path().filename().string().substr(1)));
    if (version < kPlanFormatVersion) {
      // Retired versions are refused with the rebuild instruction, never misread.
      try {
        CompiledModel::load_plan(ctx, plan);
        ADD_FAILURE() << "a version " << version << " plan was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rebuild the plan"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("version " + std::to_string(version)),
                  std::string::npos)
            << e.what();
      }
      continue;
    }
    ASSERT_EQ(version, kPlanFormatVersion) << "a plan from the future";
    ++current;
    auto kept = CompiledModel::load_plan(ctx, plan);
    EXPECT_EQ(kept->model().prompt_template, "{prompt} =");
    for (const char* text : {"reverse: suvogi", "add: 456 + 95", "copy: de"}) {
      const std::vector<int64_t> ids = fresh->tokenizer().encode(std::string(text) + " =");
      EXPECT_EQ(kept->tokenizer().encode(std::string(text) + " ="), ids);
      const Forward a = run_forward(*fresh, {}, ids, false);
      const Forward b = run_forward(*kept, {}, ids, false);
      EXPECT_EQ(std::memcmp(a.logits.raw(), b.logits.raw(), a.logits.nbytes()), 0) << text;
      Scheduler ga(*fresh), gb(*kept);
      GenerationParams p;
      p.num_beams = 2;
      EXPECT_EQ(ga.generate({ids}, p)[0].output_ids, gb.generate({ids}, p)[0].output_ids) << text;
    }
  }
  EXPECT_GE(versions, 2);
  EXPECT_EQ(current, 1) << "keep a plan of today's format version (tests/data/plans/v"
                        << kPlanFormatVersion << ")";
}

}  // namespace
}  // namespace kiln::test
