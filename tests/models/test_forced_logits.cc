// runtime/forced_logits.h against HuggingFace: the fixture models' fp32 plans teacher-forced on
// each reference case's greedy ids give HF's logits (the reference's `caseN.logits`, computed on
// greedy_ids[:-1]) within the parity bound, rows from first_row on are those rows, and
// sequences run together get what each gets alone.
#include <gtest/gtest.h>

#include <cstring>

#include "builder/builder.h"
#include "io/safetensors.h"
#include "parity_util.h"
#include "runtime/forced_logits.h"

namespace kiln::test {
namespace {

class ForcedLogits : public testing::TestWithParam<std::string> {};

TEST_P(ForcedLogits, MatchHuggingFacesTeacherForcedLogits) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const std::string model = GetParam();
  BuildOptions o;
  if (model == "bloom-tiny") o.prompt_template = "{prompt} =";
  CompiledModel plan(ctx, build_model(fixture(model), o, Logger(LogLevel::kSilent)));
  const SafetensorsFile ref = SafetensorsFile::open(fixture(model + "/reference.safetensors"));
  auto tensor = [&](const std::string& name) -> const Tensor& { return ref.tensors().at(name); };
  int cases = 0;
  std::vector<ForcedSequence> batch;
  std::vector<Tensor> alone;
  for (; ref.tensors().count("case" + std::to_string(cases) + ".logits") != 0; ++cases) {
    const std::string k = "case" + std::to_string(cases);
    ForcedSequence s;
    s.decoder_ids = ids_of(tensor(k + ".greedy_ids"));
    s.decoder_ids.pop_back();  // the reference's logits are of greedy_ids[:-1]
    if (plan.desc().encoder_decoder) s.prompt = ids_of(tensor(k + ".input_ids"));
    const Tensor all = forced_logits(plan, s);
    EXPECT_LE(relative_error(all, tensor(k + ".logits")), 1e-4) << k;
    // The last rows alone are the same rows.
    s.first_row = static_cast<int64_t>(s.decoder_ids.size()) - 2;
    const Tensor tail = forced_logits(plan, s);
    ASSERT_EQ(tail.dim(0), 2) << k;
    EXPECT_EQ(
        std::memcmp(tail.raw(), all.data<float>() + (all.dim(0) - 2) * all.dim(1), tail.nbytes()),
        0)
        << k;
    batch.push_back(s);
    alone.push_back(tail);
  }
  EXPECT_GE(cases, 9);
  // Together (several per step), each sequence gets the rows it gets alone, bit for bit.
  const std::vector<Tensor> together = forced_logits(plan, batch);
  ASSERT_EQ(together.size(), alone.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_EQ(together[i].shape(), alone[i].shape()) << i;
    EXPECT_EQ(std::memcmp(together[i].raw(), alone[i].raw(), alone[i].nbytes()), 0) << i;
  }
  ForcedSequence bad;
  bad.decoder_ids = {0, 1};
  bad.first_row = 2;
  if (plan.desc().encoder_decoder) bad.prompt = {5, 1};
  EXPECT_THROW(forced_logits(plan, bad), Error);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ForcedLogits, testing::Values("t5-tiny", "bloom-tiny"));

}  // namespace
}  // namespace kiln::test
