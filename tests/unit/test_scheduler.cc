// The scheduler's policy: streamed events, cancellation, KV budgets with admission and
// preemption, chunked prefill, per-request errors, cross K/V ownership, submission from another
// thread, and HF generation defaults. Expected outputs are the unconstrained scheduler's (itself
// checked against HuggingFace by the parity tests), never numbers written into the test.
#include <gtest/gtest.h>

#include <thread>

#include "../models/parity_util.h"
#include "builder/builder.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

class SchedulerTest : public testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    ctx_ = new Context(ContextOptions{LogLevel::kError, 2});
    for (const char* m : {"t5-tiny", "bloom-tiny"})
      models_[m] = compile_model_dir(*ctx_, fixture(m)).release();
  }
  static void TearDownTestSuite() {
    for (auto& [name, m] : models_) delete m;
    models_.clear();
    delete ctx_;
  }
  CompiledModel& model() { return *models_.at(GetParam()); }
  bool t5() const { return GetParam() == "t5-tiny"; }
  std::vector<int64_t> prompt(const std::string& text) {
    return model().tokenizer().encode(t5() ? text : text + " =");
  }
  std::vector<std::vector<int64_t>> prompts() {
    std::vector<std::vector<int64_t>> out;
    for (const char* t : {"reverse: suvogi", "add: 456 + 95", "copy: vica vica vica vica",
                          "sort: f r t d e", "upper: lubu", "count: fo va wa"})
      out.push_back(prompt(t));
    return out;
  }
  static GenerationParams greedy(int64_t n = 16) {
    GenerationParams p;
    p.max_new_tokens = n;
    return p;
  }
  std::vector<std::vector<int64_t>> run(SchedulerOptions o,
                                        const std::vector<std::vector<int64_t>>& ps,
                                        const GenerationParams& p, Scheduler** keep = nullptr) {
    Scheduler s(model(), o);
    std::vector<std::vector<int64_t>> out;
    for (GenerationResult& r : s.generate(ps, p)) out.push_back(r.output_ids);
    EXPECT_EQ(s.kv_blocks_in_use(), 0);
    return out;
  }
  static Context* ctx_;
  static std::map<std::string, CompiledModel*> models_;
};
Context* SchedulerTest::ctx_ = nullptr;
std::map<std::string, CompiledModel*> SchedulerTest::models_;

TEST_P(SchedulerTest, EventsStreamEachTokenOnceAndEndWithTheResult) {
  Scheduler s(model());
  std::map<RequestId, std::vector<int64_t>> streamed;
  std::map<RequestId, GenerationResult> results;
  for (const auto& p : prompts()) s.submit(p, greedy());
  while (!s.idle())
    for (GenerationEvent& e : s.step()) {
      ASSERT_TRUE(e.error.empty()) << e.error;
      auto& v = streamed[e.id];
      v.insert(v.end(), e.new_tokens.begin(), e.new_tokens.end());
      if (e.finished) {
        EXPECT_EQ(results.count(e.id), 0u) << "one finished event per request";
        results[e.id] = e.result;
      }
    }
  ASSERT_EQ(results.size(), prompts().size());
  for (const auto& [id, r] : results) EXPECT_EQ(streamed[id], r.output_ids) << "request " << id;
}

TEST_P(SchedulerTest, CancelFreesBlocksBeforeTheNextStepAndLeavesOthersIntact) {
  const auto ps = prompts();
  const auto expected = run({}, ps, greedy());
  SchedulerOptions o;
  o.max_batch = 2;  // the third request waits
  Scheduler s(model(), o);
  std::vector<RequestId> ids;
  for (const auto& p : ps) ids.push_back(s.submit(p, greedy()));
  std::map<RequestId, GenerationEvent> finished;
  auto collect = [&](std::vector<GenerationEvent> events) {
    for (GenerationEvent& e : events)
      if (e.finished) finished[e.id] = e;
  };
  collect(s.step());
  collect(s.step());
  const int64_t before = s.kv_blocks_in_use();
  EXPECT_GT(before, 0);
  s.cancel(ids[0]);  // running
  s.cancel(ids[4]);  // still waiting
  s.cancel(9999);    // unknown: ignored
  collect(s.step());
  ASSERT_EQ(finished.count(ids[0]), 1u);
  EXPECT_EQ(finished[ids[0]].result.finish_reason, FinishReason::kCancelled);
  EXPECT_LE(finished[ids[0]].result.output_ids.size(), 3u) << "tokens generated before cancel";
  ASSERT_EQ(finished.count(ids[4]), 1u);
  EXPECT_EQ(finished[ids[4]].result.finish_reason, FinishReason::kCancelled);
  while (!s.idle()) collect(s.step());
  EXPECT_EQ(s.kv_blocks_in_use(), 0);
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i == 0 || i == 4) continue;
    EXPECT_EQ(finished.at(ids[i]).result.output_ids, expected[i]) << "request " << i;
  }
}

// A tight KV budget forces preemption (recompute); results equal the unconstrained run.
TEST_P(SchedulerTest, PreemptionUnderAKvBudgetRecomputesToTheSameResult) {
  const auto ps = prompts();
  const auto expected = run({}, ps, greedy(24));
  SchedulerOptions o;
  o.kv_block_size = 4;
  // T5's decoder cache holds only the (short) answers; BLOOM's holds prompt + answer.
  o.kv_budget_blocks = t5() ? 8 : 14;
  o.max_batch = 6;
  Scheduler s(model(), o);
  std::vector<std::vector<int64_t>> got;
  for (GenerationResult& r : s.generate(ps, greedy(24))) got.push_back(r.output_ids);
  EXPECT_EQ(got, expected);
  EXPECT_GT(s.preemptions(), 0) << "the budget should have forced preemption";
  EXPECT_EQ(s.kv_blocks_in_use(), 0);
}

TEST_P(SchedulerTest, BeamsUnderAKvBudget) {
  GenerationParams beams = greedy(12);
  beams.num_beams = 3;
  const auto ps = prompts();
  const auto expected = run({}, ps, beams);
  SchedulerOptions o;
  o.kv_block_size = 4;
  o.kv_budget_blocks = 40;
  EXPECT_EQ(run(o, ps, beams), expected);
}

// Long prompts prefilled in chunks give the same tokens as one prefill.
TEST_P(SchedulerTest, ChunkedPrefillMatchesOnePass) {
  const SafetensorsFile ref = SafetensorsFile::open(fixture(GetParam() + "/reference.safetensors"));
  std::vector<std::vector<int64_t>> ps = prompts();
  ps.push_back(ids_of(ref.tensors().at("case8.input_ids")));  // the long prompt
  const auto expected = run({}, ps, greedy());
  SchedulerOptions o;
  o.max_batch = 4;
  o.max_step_tokens = 5;  // at least max_batch; prompts of 10+ tokens take several steps
  EXPECT_EQ(run(o, ps, greedy()), expected);
}

TEST_P(SchedulerTest, BadInputRequestBeyondTheKvBudgetFailsAloneWithAnError) {
  SchedulerOptions o;
  o.kv_block_size = 4;
  o.kv_budget_blocks = 6;
  Scheduler s(model(), o);
  // BLOOM: a prompt longer than the budget; T5 (whose cache holds only decoder tokens): an
  // answer forced to be longer than the budget.
  std::vector<int64_t> huge(40, prompt("copy: a")[0]);
  GenerationParams long_answer = greedy(40);
  long_answer.min_new_tokens = 40;
  const RequestId bad = t5() ? s.submit(prompt("copy: a"), long_answer) : s.submit(huge, greedy(4));
  const RequestId good = s.submit(prompt("copy: de"), greedy(4));
  std::map<RequestId, GenerationEvent> done;
  while (!s.idle())
    for (GenerationEvent& e : s.step())
      if (e.finished) done[e.id] = e;
  EXPECT_NE(done.at(bad).error.find("KV"), std::string::npos) << done.at(bad).error;
  EXPECT_TRUE(done.at(good).error.empty()) << done.at(good).error;
  EXPECT_FALSE(done.at(good).result.output_ids.empty());
  EXPECT_EQ(s.kv_blocks_in_use(), 0);
}

// Greedy rows leave the backend as token ids: no [rows, vocab] logits on the host (64 MB for 64
// BLOOM rows, touched anew by every scheduler, was 30 ms of a batch's first token on the GPU).
// A row that samples over the whole vocabulary (top_k 0) has its row copied out.
TEST_P(SchedulerTest, HostLogitsOnlyForRowsThatNeedThem) {
  Scheduler s(model());
  s.submit(prompt("reverse: suvogi"), greedy(4));
  s.submit(prompt("add: 456 + 95"), greedy(4));
  s.step();
  s.step();
  EXPECT_EQ(s.host_logits_bytes(), 0);
  GenerationParams sample = greedy(4);
  sample.do_sample = true;
  sample.top_k = 0;
  sample.seed = 7;
  s.submit(prompt("copy: vica vica"), sample);
  s.step();
  s.step();
  EXPECT_GT(s.host_logits_bytes(), 0);
}

TEST_P(SchedulerTest, CrossKvHoldsOnlyEachRequestsOwnRows) {
  if (!t5()) GTEST_SKIP() << "decoder-only models have no cross attention";
  Scheduler s(model());
  const auto a = prompt("reverse: suvogi"), b = prompt("copy: vica vica vica vica");
  s.submit(a, greedy(4));
  s.submit(b, greedy(4));
  s.step();
  const ModelDesc& d = model().desc();
  const int64_t per_token = 2LL * d.cache_layers * d.cache_row_width() * 4;
  EXPECT_EQ(s.cross_kv_bytes(), static_cast<int64_t>(a.size() + b.size()) * per_token);
}

TEST_P(SchedulerTest, SubmitAndCancelFromAnotherThread) {
  Scheduler s(model());
  const auto ps = prompts();
  std::atomic<int> submitted{0};
  std::thread producer([&] {
    for (int round = 0; round < 3; ++round)
      for (const auto& p : ps) {
        s.submit(p, greedy(6));
        ++submitted;
      }
  });
  int finished = 0;
  while (submitted < 3 * static_cast<int>(ps.size()) || !s.idle())
    for (const GenerationEvent& e : s.step()) finished += e.finished;
  producer.join();
  while (!s.idle())
    for (const GenerationEvent& e : s.step()) finished += e.finished;
  EXPECT_EQ(finished, 3 * static_cast<int>(ps.size()));
}

TEST_P(SchedulerTest, MinNewTokensDelaysEos) {
  Scheduler s(model());
  const auto p = prompt("count: fo va wa");
  const auto plain = s.generate({p}, greedy(16))[0];
  ASSERT_EQ(plain.finish_reason, FinishReason::kEos);
  GenerationParams at_least = greedy(16);
  at_least.min_new_tokens = static_cast<int64_t>(plain.output_ids.size()) + 3;
  const auto longer = s.generate({p}, at_least)[0];
  EXPECT_GE(longer.output_ids.size(), plain.output_ids.size() + 3);
  EXPECT_TRUE(
      std::equal(plain.output_ids.begin(), plain.output_ids.end(), longer.output_ids.begin()))
      << "the same tokens until the original EOS";
}

// HF's max_length counts the prompt for decoder-only models and the start token for T5.
TEST_P(SchedulerTest, MaxLengthFromTheGenerationConfig) {
  const auto ids = prompt("copy: vica vica vica vica");
  ModelDesc d = model().desc();
  d.generation.max_length = t5() ? 9 : static_cast<int64_t>(ids.size()) + 3;
  GenerationParams p = default_generation_params(d);
  EXPECT_EQ(p.max_new_tokens, 0);
  p.min_new_tokens = 16;  // run to the length limit
  Scheduler s(model());
  const int64_t expect_new = t5() ? 8 : 3;
  ASSERT_GT(expect_new, 0);
  EXPECT_EQ(static_cast<int64_t>(s.generate({ids}, p)[0].output_ids.size()), expect_new);
  d.generation.max_length = 2;
  if (!t5()) {
    try {
      s.submit(ids, default_generation_params(d));
      ADD_FAILURE() << "a prompt longer than max_length was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, SchedulerTest, testing::Values("t5-tiny", "bloom-tiny"),
                         [](const auto& info) {
                           return info.param == "t5-tiny" ? std::string("T5") : "Bloom";
                         });

TEST(GenerationDefaults, GenerationConfigFieldsBecomeParams) {
  ModelDesc d;
  d.generation.max_new_tokens = 7;
  d.generation.num_beams = 3;
  d.generation.length_penalty = 0.5;
  d.generation.early_stopping = EarlyStoppingSetting::kNever;
  d.generation.do_sample = true;
  d.generation.temperature = 0.25f;
  d.generation.top_k = 9;
  d.generation.top_p = 0.5f;
  d.generation.min_new_tokens = 2;
  const GenerationParams p = default_generation_params(d);
  EXPECT_EQ(p.max_new_tokens, 7);
  EXPECT_EQ(p.num_beams, 3);
  EXPECT_EQ(p.length_penalty, 0.5);
  EXPECT_EQ(p.early_stopping, EarlyStopping::kNever);
  EXPECT_TRUE(p.do_sample);
  EXPECT_EQ(p.temperature, 0.25f);
  EXPECT_EQ(p.top_k, 9);
  EXPECT_EQ(p.top_p, 0.5f);
  EXPECT_EQ(p.min_new_tokens, 2);
  // Nothing set: HF's defaults (early_stopping False = the heuristic, top_k 50) and kiln's 16.
  const GenerationParams none = default_generation_params(ModelDesc{});
  EXPECT_EQ(none.max_new_tokens, 16);
  EXPECT_EQ(none.num_beams, 1);
  EXPECT_EQ(none.early_stopping, EarlyStopping::kHeuristic);
  EXPECT_EQ(none.top_k, 50);
  EXPECT_FALSE(none.do_sample);
}

}  // namespace
}  // namespace kiln::test
