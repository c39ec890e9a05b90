// The scheduler's run-ahead (a decode step queued before the tokens of the one before it are
// read): every request gets the tokens, finish reasons and streamed events it gets when each
// step is read before the next, whatever joins, stops, is cancelled or is preempted meanwhile.
// On the CPU run-ahead is forced on (it changes the order of the work there, not its amount);
// on CUDA it is the default. The expected outputs are the same scheduler's with run-ahead off.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "../models/parity_util.h"
#include "builder/builder.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

struct Case {
  std::string model;
  Device device;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.model << " on " << device_name(c.device); }

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string name = info.param.model + "_" + std::string(device_name(info.param.device));
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}

// One request of a scenario: when it is submitted and (optionally) cancelled, counted in calls
// of step().
struct Job {
  std::string text;
  GenerationParams params;
  int submit_at = 0;
  int cancel_at = -1;
};

struct Outcome {
  std::vector<int64_t> ids;
  FinishReason reason = FinishReason::kLength;
  std::vector<int64_t> streamed;
};

class RunAhead : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (GetParam().device == Device::kCuda)
      if (const std::string why = no_gpu_reason(); !why.empty())
        GTEST_SKIP() << why << ": run-ahead on CUDA is tested on the GPU machine";
    ctx_ = std::make_unique<Context>(ContextOptions{LogLevel::kWarning, 2});
    BuildOptions options;
    options.device = GetParam().device;
    model_ = compile_model_dir(*ctx_, fixture(GetParam().model), options);
  }
  bool t5() const { return GetParam().model == "t5-tiny"; }
  std::vector<int64_t> prompt(const std::string& text) {
    return model_->tokenizer().encode(t5() ? text : text + " =");
  }
  // A prompt of over 64 tokens for both fixtures.
  static std::string long_copy_text() {
    std::string text = "copy:";
    for (int i = 0; i < 24; ++i) text += i % 2 ? " vica" : " suvo";
    return text;
  }
  static GenerationParams greedy(int64_t n) {
    GenerationParams p;
    p.max_new_tokens = n;
    return p;
  }
  SchedulerOptions options(bool ahead) const {
    SchedulerOptions o;
    o.run_ahead = ahead ? kiln::RunAhead::kOn : kiln::RunAhead::kOff;
    return o;
  }
  // Runs the jobs; every event is checked (one finished event per request, no errors).
  std::vector<Outcome> drive(SchedulerOptions o, const std::vector<Job>& jobs,
                             int64_t* steps_ahead = nullptr, int64_t* steps = nullptr,
                             int64_t* encoder_steps = nullptr) {
    Scheduler s(*model_, o);
    std::map<RequestId, size_t> index;
    std::vector<Outcome> out(jobs.size());
    std::vector<bool> finished(jobs.size(), false);
    size_t done = 0;
    for (int call = 0; done < jobs.size(); ++call) {
      EXPECT_LT(call, 10000) << "the scheduler does not finish";
      if (call >= 10000) break;
      for (size_t j = 0; j < jobs.size(); ++j) {
        if (jobs[j].submit_at == call) index[s.submit(prompt(jobs[j].text), jobs[j].params)] = j;
        if (jobs[j].cancel_at == call)
          for (const auto& [id, at] : index)
            if (at == j) s.cancel(id);
      }
      for (GenerationEvent& e : s.step()) {
        EXPECT_TRUE(e.error.empty()) << e.error;
        const size_t j = index.at(e.id);
        Outcome& r = out[j];
        r.streamed.insert(r.streamed.end(), e.new_tokens.begin(), e.new_tokens.end());
        if (!e.finished) continue;
        EXPECT_FALSE(finished[j]) << "job " << j << " finished twice";
        finished[j] = true;
        ++done;
        r.ids = e.result.output_ids;
        r.reason = e.result.finish_reason;
      }
    }
    EXPECT_EQ(s.kv_blocks_in_use(), 0);
    if (steps_ahead != nullptr) *steps_ahead = s.steps_ahead();
    if (steps != nullptr) *steps = s.steps();
    if (encoder_steps != nullptr) *encoder_steps = s.encoder_steps();
    return out;
  }
  void expect_same(const std::vector<Outcome>& got, const std::vector<Outcome>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < got.size(); ++j) {
      EXPECT_EQ(got[j].ids, want[j].ids) << "job " << j;
      EXPECT_EQ(got[j].reason, want[j].reason) << "job " << j;
      EXPECT_EQ(got[j].streamed, got[j].ids) << "job " << j << ": each token streamed once";
    }
  }

  std::unique_ptr<Context> ctx_;
  std::unique_ptr<CompiledModel> model_;
};

TEST_P(RunAhead, ResolvesToTheBackendUnlessForced) {
  EXPECT_EQ(Scheduler(*model_).runs_ahead(), GetParam().device == Device::kCuda);
  EXPECT_TRUE(Scheduler(*model_, options(true)).runs_ahead());
  EXPECT_FALSE(Scheduler(*model_, options(false)).runs_ahead());
}

// Requests stop at different steps (EOS, their own length limits, min_new_tokens), so the
// batch changes while a step is queued: a stopped request's queued row is dropped.
TEST_P(RunAhead, SameTokensAsReadingEveryStep) {
  std::vector<Job> jobs;
  const char* texts[] = {"reverse: suvogi", "add: 456 + 95", "copy: vica vica vica vica",
                         "sort: f r t d e", "upper: lubu",   "count: fo va wa"};
  for (int i = 0; i < 6; ++i) {
    GenerationParams p = greedy(3 + 3 * i);
    if (i == 4) p.min_new_tokens = 12;  // EOS banned for a while
    if (i == 5) p.ignore_eos = true;
    jobs.push_back({texts[i], p});
  }
  int64_t ahead = 0, plain_ahead = 0;
  const auto want = drive(options(false), jobs, &plain_ahead);
  const auto got = drive(options(true), jobs, &ahead);
  expect_same(got, want);
  EXPECT_EQ(plain_ahead, 0);
  EXPECT_GT(ahead, 0) << "no step was queued behind an unread one";
  bool eos = false;
  for (const Outcome& o : want) eos |= o.reason == FinishReason::kEos;
  EXPECT_TRUE(eos) << "the scenario should include a request that stops at EOS";
}

// Requests join and are cancelled while a step is queued; one request samples (no run-ahead
// while it runs). Cancelled requests end with a prefix of what they generate alone.
TEST_P(RunAhead, JoinsCancelsAndSamplingWhileAStepIsQueued) {
  GenerationParams sampled = greedy(6);
  sampled.do_sample = true;
  sampled.seed = 7;
  sampled.ignore_eos = true;
  GenerationParams long_greedy = greedy(20);
  long_greedy.ignore_eos = true;
  const std::vector<Job> jobs = {
      {"copy: vica vica vica vica", long_greedy, 0},
      {"add: 456 + 95", long_greedy, 0, 9},
      {"reverse: suvogi", greedy(12), 5},
      {"sort: f r t d e", sampled, 11},
      {"upper: lubu", long_greedy, 13, 17},
  };
  int64_t ahead = 0;
  const auto want = drive(options(false), jobs);
  const auto got = drive(options(true), jobs, &ahead);
  EXPECT_GT(ahead, 0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (jobs[j].cancel_at >= 0) {
      // When the cancel lands differs by a step: compare against the uncancelled run.
      std::vector<Job> alone = {jobs[j]};
      alone[0].submit_at = 0;
      alone[0].cancel_at = -1;
      const auto full = drive(options(false), alone);
      EXPECT_EQ(got[j].reason, FinishReason::kCancelled) << "job " << j;
      ASSERT_LE(got[j].ids.size(), full[0].ids.size()) << "job " << j;
      EXPECT_TRUE(std::equal(got[j].ids.begin(), got[j].ids.end(), full[0].ids.begin()))
          << "job " << j;
      EXPECT_EQ(got[j].streamed, got[j].ids) << "job " << j;
      continue;
    }
    EXPECT_EQ(got[j].ids, want[j].ids) << "job " << j;
    EXPECT_EQ(got[j].reason, want[j].reason) << "job " << j;
    EXPECT_EQ(got[j].streamed, got[j].ids) << "job " << j;
  }
}

// More requests than the batch holds: the ones waiting for room do not stop run-ahead, and are
// admitted as the running ones finish.
TEST_P(RunAhead, RequestsWaitingForRoomInAFullBatch) {
  SchedulerOptions o = options(true);
  o.max_batch = 2;
  SchedulerOptions plain = o;
  plain.run_ahead = kiln::RunAhead::kOff;
  std::vector<Job> jobs;
  int64_t n = 4;
  for (const char* t : {"reverse: suvogi", "add: 456 + 95", "copy: vica vica vica vica",
                        "sort: f r t d e", "upper: lubu"}) {
    GenerationParams p = greedy(n);
    p.ignore_eos = true;
    jobs.push_back({t, p});
    n += 3;
  }
  int64_t ahead = 0;
  expect_same(drive(o, jobs, &ahead), drive(plain, jobs));
  EXPECT_GT(ahead, 0);
}

// A KV budget small enough that requests are preempted: run-ahead stops where a queued step
// would need a block the budget does not have, and the results stay the same.
TEST_P(RunAhead, PreemptionUnderAKvBudget) {
  SchedulerOptions o = options(true);
  o.kv_block_size = 4;
  o.kv_budget_blocks = t5() ? 8 : 14;
  o.max_batch = 6;
  SchedulerOptions plain = o;
  plain.run_ahead = kiln::RunAhead::kOff;
  std::vector<Job> jobs;
  for (const char* t : {"reverse: suvogi", "add: 456 + 95", "copy: vica vica vica vica",
                        "sort: f r t d e", "upper: lubu", "count: fo va wa"})
    jobs.push_back({t, greedy(24)});
  expect_same(drive(o, jobs), drive(plain, jobs));
}

// Serving traffic: greedy requests arrive one a step while others end at their length limits
// and at EOS. The batch changes without a planned step: every step after the first is queued
// behind an unread one (the ended requests' rows dropped, the new prompts joined, an
// encoder-decoder model's encoder queued just before the step they join). Without
// encode_ahead, an encoder-decoder model's arrivals need planned steps. The tokens are those of
// reading every step.
TEST_P(RunAhead, RequestsJoinAndLeaveWithoutAPlannedStep) {
  const char* texts[] = {"reverse: suvogi", "add: 456 + 95", "copy: vica vica vica vica",
                         "sort: f r t d e", "upper: lubu",   "count: fo va wa"};
  std::vector<Job> jobs;
  for (int i = 0; i < 12; ++i) {
    GenerationParams p = greedy(2 + (i * 5) % 11);
    p.ignore_eos = i % 3 != 0;  // every third may stop at EOS
    jobs.push_back({texts[i % 6], p, i});
  }
  int64_t ahead = 0, steps = 0;
  const auto want = drive(options(false), jobs);
  SchedulerOptions encode_ahead = options(true);
  encode_ahead.encode_ahead = true;
  const auto got = drive(encode_ahead, jobs, &ahead, &steps);
  expect_same(got, want);
  EXPECT_EQ(ahead, steps - 1) << "every step after the first is queued behind an unread one";
  if (!t5()) return;
  expect_same(drive(options(true), jobs, &ahead, &steps), want);
  EXPECT_GT(ahead, 0);
  EXPECT_LT(ahead, steps - 1) << "arrivals need planned steps without encode_ahead";
}

// Encoder-decoder arrivals under encode_ahead with encode_gather_steps: the arrivals of a few
// queued steps wait and share one encoder step (its cost is mostly its launches, whatever its
// tokens), still without a planned step. The tokens are those of reading every step.
TEST_P(RunAhead, ArrivalsGatherForOneEncoderStep) {
  if (!t5()) GTEST_SKIP() << "a decoder-only model has no encoder step";
  const char* texts[] = {"reverse: suvogi", "add: 456 + 95", "copy: vica vica vica vica",
                         "sort: f r t d e", "upper: lubu",   "count: fo va wa"};
  std::vector<Job> jobs;
  for (int i = 0; i < 12; ++i) {
    GenerationParams p = greedy(6 + (i * 5) % 11);
    p.ignore_eos = true;
    jobs.push_back({texts[i % 6], p, i < 2 ? 0 : i});
  }
  const auto want = drive(options(false), jobs);
  SchedulerOptions o = options(true);
  o.encode_ahead = true;
  int64_t ahead = 0, steps = 0, each = 0, gathered = 0;
  expect_same(drive(o, jobs, &ahead, &steps, &each), want);
  EXPECT_EQ(ahead, steps - 1);
  o.encode_gather_steps = 3;
  expect_same(drive(o, jobs, &ahead, &steps, &gathered), want);
  EXPECT_EQ(ahead, steps - 1) << "gathering needs no planned step";
  EXPECT_LT(gathered, each) << "arrivals of several steps share an encoder step";
}

// Long prompts (over 64 tokens) join a decoding batch, the same arrivals three times over: on
// CUDA the steps they join are replayed from graphs (captured the second time a step shape runs,
// replayed the third), and every round gives the tokens of the first (whose steps ran kernel by
// kernel) and of reading every step.
TEST_P(RunAhead, LongPromptsJoiningTheSameWayEachRound) {
  const std::string long_text = long_copy_text();
  ASSERT_GT(prompt(long_text).size(), 64u);
  const char* texts[] = {"reverse: suvogi", "add: 456 + 95", "sort: f r t d e"};
  std::vector<Job> round;
  for (int i = 0; i < 6; ++i) {
    GenerationParams p = greedy(4 + 2 * i);
    p.ignore_eos = true;
    round.push_back({i % 2 ? long_text : texts[i / 2], p, i});
  }
  std::vector<Job> jobs;
  for (int r = 0; r < 3; ++r)
    for (Job j : round) {
      j.submit_at += 40 * r;  // each round starts after the one before it has ended
      jobs.push_back(j);
    }
  const auto want = drive(options(false), jobs);
  const auto got = drive(options(true), jobs);
  expect_same(got, want);
  for (size_t j = round.size(); j < jobs.size(); ++j)
    EXPECT_EQ(got[j].ids, got[j % round.size()].ids) << "job " << j << " against the first round";
}

// Prompts longer than what a queued step takes join a decoding batch in chunks, every chunk in a
// queued step (none waits for a planned one): under a step budget of 16 tokens (a prompt over it
// used to need a planned step), and under a run-ahead limit of 4 prompt tokens a step beside the
// plan's step budget (more steps than without it: no step takes a whole long prompt). The tokens
// are those of reading every step.
TEST_P(RunAhead, LongPromptsJoinInChunksOfTheStepLimit) {
  const std::string long_text = long_copy_text();
  ASSERT_GT(prompt(long_text).size(), 40u);
  const char* texts[] = {"reverse: suvogi", "add: 456 + 95", "sort: f r t d e"};
  std::vector<Job> jobs;
  for (int i = 0; i < 7; ++i) {
    GenerationParams p = greedy(6 + 3 * i);
    p.ignore_eos = true;
    jobs.push_back({i % 2 ? long_text : texts[i / 2 % 3], p, i < 2 ? 0 : 2 * i});
  }
  SchedulerOptions base = options(false);
  base.max_step_tokens = 16;
  const auto want = drive(base, jobs);
  SchedulerOptions ahead = options(true);
  ahead.max_step_tokens = 16;
  ahead.encode_ahead = true;
  int64_t queued = 0, steps = 0;
  if (!t5()) {
    // An encoder-decoder prompt is encoded whole: over 16 tokens it needs a planned step.
    expect_same(drive(ahead, jobs, &queued, &steps), want);
    EXPECT_EQ(queued, steps - 1) << "every chunk joins a queued step";
  }
  ahead = options(true);
  ahead.encode_ahead = true;
  int64_t wide = 0;
  expect_same(drive(ahead, jobs, &queued, &wide), want);
  EXPECT_EQ(queued, wide - 1);
  ahead.join_prompt_tokens = 4;
  expect_same(drive(ahead, jobs, &queued, &steps), want);
  EXPECT_EQ(queued, steps - 1);
  if (!t5()) {
    EXPECT_GT(steps, wide) << "the long prompts join in chunks of at most 4 tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RunAhead,
                         testing::Values(Case{"t5-tiny", Device::kCpu},
                                         Case{"bloom-tiny", Device::kCpu},
                                         Case{"t5-tiny", Device::kCuda},
                                         Case{"bloom-tiny", Device::kCuda}),
                         case_name);

}  // namespace
}  // namespace kiln::test
