// The GenerationExecutor (an engine thread stepping a Scheduler for other threads) and the
// public Engine over it: results equal the Scheduler's own (itself checked against HuggingFace
// by the parity tests) whatever the concurrency, streamed text concatenates to the whole text,
// stop strings end the text before them, cancellation and deadlines end a request and free its
// KV blocks, a full queue refuses, drain finishes what is in flight, and an idle executor uses
// no CPU. Expected outputs are computed by the Scheduler or the tokenizer, never written here.
#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "../models/parity_util.h"
#include "builder/builder.h"
#include "kiln/engine.h"
#include "plan/plan.h"
#include "runtime/generation_executor.h"

namespace kiln::test {
namespace {

using namespace std::chrono_literals;

class GenerationExecutorTest : public testing::TestWithParam<std::string> {
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
    for (const char* t :
         {"reverse: suvogi", "add: 456 + 95", "copy: vica vica vica vica", "sort: f r t d e",
          "upper: lubu", "count: fo va wa", "add: 12 + 30", "reverse: abcdef"})
      out.push_back(prompt(t));
    return out;
  }
  static GenerationParams greedy(int64_t n = 16) {
    GenerationParams p;
    p.max_new_tokens = n;
    return p;
  }
  // A request that runs long: EOS ignored.
  static GenerationParams endless(int64_t n = 400) {
    GenerationParams p = greedy(n);
    p.ignore_eos = true;
    return p;
  }
  // The Scheduler's results. Never while an executor of the same model exists: one thread at a
  // time may step a model.
  std::vector<GenerationResult> reference(const std::vector<std::vector<int64_t>>& ps,
                                          const GenerationParams& p) {
    Scheduler s(model(), SchedulerOptions{});
    return s.generate(ps, p);
  }
  // Reads a stream to its end.
  static std::vector<ResponseChunk> drain_stream(ResponseStream& s) {
    std::vector<ResponseChunk> all;
    while (s.next(all)) {
    }
    return all;
  }
  static std::vector<int64_t> ids_of(const std::vector<ResponseChunk>& chunks) {
    std::vector<int64_t> out;
    for (const ResponseChunk& c : chunks)
      out.insert(out.end(), c.token_ids.begin(), c.token_ids.end());
    return out;
  }
  static std::string text_of(const std::vector<ResponseChunk>& chunks) {
    std::string out;
    for (const ResponseChunk& c : chunks) out += c.text;
    return out;
  }
  // Waits until the published stats satisfy `pred` (they are published after each step).
  template <typename Pred>
  static bool eventually(const GenerationExecutor& ex, Pred pred) {
    for (int i = 0; i < 500; ++i) {
      if (pred(ex.stats())) return true;
      std::this_thread::sleep_for(2ms);
    }
    return false;
  }
  static Context* ctx_;
  static std::map<std::string, CompiledModel*> models_;
};
Context* GenerationExecutorTest::ctx_ = nullptr;
std::map<std::string, CompiledModel*> GenerationExecutorTest::models_;

TEST_P(GenerationExecutorTest, ConcurrentRequestsGiveTheSchedulersResultsAndText) {
  const auto ps = prompts();
  const auto want = reference(ps, greedy());
  ExecutorOptions o;
  o.scheduler.max_batch = 4;  // fewer slots than requests: some wait and join later
  GenerationExecutor ex(model(), o);
  std::vector<std::vector<ResponseChunk>> got(ps.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ps.size(); ++i)
    threads.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(3 * i));  // arrive while others run
      got[i] = drain_stream(*ex.enqueue(ps[i], greedy()));
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_FALSE(got[i].empty());
    EXPECT_TRUE(got[i].back().finished);
    EXPECT_EQ(got[i].back().cause, EndCause::kFinished);
    EXPECT_EQ(ids_of(got[i]), want[i].output_ids) << "prompt " << i;
    EXPECT_EQ(got[i].back().finish_reason, want[i].finish_reason);
    EXPECT_EQ(text_of(got[i]), model().tokenizer().decode(want[i].output_ids)) << "prompt " << i;
  }
  // (The stats are published after the step that ended the last request.)
  const int64_t n = static_cast<int64_t>(ps.size());
  ASSERT_TRUE(eventually(ex, [&](const ExecutorStats& st) { return st.success == n; }));
  const ExecutorStats s = ex.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.pending, 0);
  EXPECT_EQ(s.ttft_seconds.count, static_cast<int64_t>(ps.size()));
  EXPECT_GT(s.steps, 0);
}

TEST_P(GenerationExecutorTest, BeamSearchDeliversItsResultAtTheEnd) {
  GenerationParams p = greedy(12);
  p.num_beams = 4;
  const auto ps = prompts();
  const auto want = reference({ps[0], ps[3]}, p);
  GenerationExecutor ex(model(), ExecutorOptions{});
  auto a = ex.enqueue(ps[0], p);
  auto b = ex.enqueue(ps[3], p);
  const auto ca = drain_stream(*a), cb = drain_stream(*b);
  EXPECT_EQ(ids_of(ca), want[0].output_ids);
  EXPECT_EQ(ids_of(cb), want[1].output_ids);
  EXPECT_EQ(text_of(ca), model().tokenizer().decode(want[0].output_ids));
  EXPECT_FLOAT_EQ(ca.back().score, want[0].score);
}

TEST_P(GenerationExecutorTest, StopStringEndsTheTextBeforeIt) {
  const auto ps = prompts();
  const GenerationParams p = endless(24);
  const std::string full = model().tokenizer().decode(reference({ps[2]}, p)[0].output_ids);
  ASSERT_GE(full.size(), 6u) << full;
  // A stop string from the middle of the text: the text ends where it first occurs.
  const std::string stop = full.substr(full.size() / 2, 3);
  GenerationParams with_stop = p;
  with_stop.stop_strings = {"never in the text \x01", stop};
  GenerationExecutor ex(model(), ExecutorOptions{});
  const auto chunks = drain_stream(*ex.enqueue(ps[2], with_stop));
  EXPECT_EQ(text_of(chunks), full.substr(0, full.find(stop)));
  EXPECT_EQ(chunks.back().finish_reason, FinishReason::kStop);
  EXPECT_EQ(chunks.back().cause, EndCause::kFinished);
  EXPECT_TRUE(eventually(ex, [](const ExecutorStats& s) { return s.kv_blocks_used == 0; }))
      << "a stop string frees the request's blocks";
}

TEST_P(GenerationExecutorTest, CancelMidStreamEndsItAndFreesItsBlocks) {
  const auto ps = prompts();
  const auto want_other = reference({ps[1]}, greedy())[0].output_ids;
  GenerationExecutor ex(model(), ExecutorOptions{});
  auto other = ex.enqueue(ps[1], greedy());
  auto s = ex.enqueue(ps[0], endless());
  std::vector<ResponseChunk> chunks;
  while (ids_of(chunks).empty()) ASSERT_TRUE(s->next(chunks));
  EXPECT_GT(ex.stats().kv_blocks_used + 1, 0);
  ex.cancel(s->id());
  while (s->next(chunks)) {
  }
  EXPECT_EQ(chunks.back().cause, EndCause::kCancelled);
  EXPECT_EQ(chunks.back().finish_reason, FinishReason::kCancelled);
  EXPECT_LT(ids_of(chunks).size(), 400u);
  // The other request is untouched.
  EXPECT_EQ(ids_of(drain_stream(*other)), want_other);
  EXPECT_TRUE(eventually(ex, [](const ExecutorStats& st) {
    return st.kv_blocks_used == 0 && st.cancelled == 1 && st.success == 1;
  }));
}

TEST_P(GenerationExecutorTest, BadInputFullQueueIsRefusedWithAClearError) {
  const auto ps = prompts();
  const auto want = reference({ps[2]}, greedy())[0].output_ids;
  ExecutorOptions o;
  o.scheduler.max_batch = 1;
  o.max_queue = 1;
  o.name = "tiny";
  GenerationExecutor ex(model(), o);
  auto running = ex.enqueue(ps[0], endless());
  auto waiting = ex.enqueue(ps[1], endless());
  try {
    ex.enqueue(ps[2], greedy());
    FAIL() << "a third request was accepted";
  } catch (const QueueFullError& e) {
    EXPECT_NE(std::string(e.what()).find("queue is full"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tiny"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ex.stats().rejected, 1);
  ex.cancel(running->id());
  ex.cancel(waiting->id());
  drain_stream(*running);
  drain_stream(*waiting);
  // Room again.
  EXPECT_EQ(ids_of(drain_stream(*ex.enqueue(ps[2], greedy()))), want);
}

TEST_P(GenerationExecutorTest, BadInputParametersThrowAtEnqueueNamingTheField) {
  GenerationExecutor ex(model(), ExecutorOptions{});
  GenerationParams p = greedy();
  p.top_p = -1.0f;
  try {
    ex.enqueue(prompts()[0], p);
    FAIL() << "top_p -1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top-p"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ex.in_flight(), 0);
}

TEST_P(GenerationExecutorTest, DeadlinesEndRequestsWithTimeouts) {
  const auto ps = prompts();
  ExecutorOptions o;
  o.scheduler.max_batch = 1;
  GenerationExecutor ex(model(), o);
  RequestOptions total;
  total.deadline = Clock::now() + 30ms;
  auto long_one = ex.enqueue(ps[0], endless(4000), total);
  RequestOptions queue;
  queue.queue_deadline = Clock::now() + 5ms;  // cannot start: the one slot is taken
  auto queued = ex.enqueue(ps[1], greedy(), queue);
  const auto a = drain_stream(*long_one), b = drain_stream(*queued);
  EXPECT_EQ(a.back().cause, EndCause::kTimeout);
  EXPECT_FALSE(a.back().error.empty());
  EXPECT_EQ(b.back().cause, EndCause::kQueueTimeout);
  EXPECT_TRUE(ids_of(b).empty());
  EXPECT_TRUE(eventually(ex, [](const ExecutorStats& s) {
    return s.kv_blocks_used == 0 && s.timeouts == 1 && s.queue_timeouts == 1;
  }));
}

TEST_P(GenerationExecutorTest, DrainFinishesWhatIsInFlightAndRefusesNewRequests) {
  const auto ps = prompts();
  GenerationExecutor ex(model(), ExecutorOptions{});
  auto a = ex.enqueue(ps[0], greedy());
  auto b = ex.enqueue(ps[1], greedy());
  EXPECT_TRUE(ex.drain(Clock::now() + 30s));
  EXPECT_EQ(drain_stream(*a).back().cause, EndCause::kFinished);
  EXPECT_EQ(drain_stream(*b).back().cause, EndCause::kFinished);
  EXPECT_THROW(ex.enqueue(ps[2], greedy()), Error);
}

TEST_P(GenerationExecutorTest, DrainPastItsDeadlineCancelsTheRest) {
  GenerationExecutor ex(model(), ExecutorOptions{});
  auto a = ex.enqueue(prompts()[0], endless(4000));
  EXPECT_FALSE(ex.drain(Clock::now() + 20ms));
  EXPECT_EQ(drain_stream(*a).back().cause, EndCause::kCancelled);
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

TEST_P(GenerationExecutorTest, AnIdleExecutorUsesNoCpu) {
  GenerationExecutor ex(model(), ExecutorOptions{});
  drain_stream(*ex.enqueue(prompts()[0], greedy()));  // it has worked, and is idle now
  std::this_thread::sleep_for(50ms);
  const double before = process_cpu_seconds();
  std::this_thread::sleep_for(400ms);
  const double used = process_cpu_seconds() - before;
  EXPECT_LT(used, 0.02) << "the idle executor (and the thread pool) spent " << used
                        << " s of CPU in 0.4 s";
}

INSTANTIATE_TEST_SUITE_P(Models, GenerationExecutorTest, testing::Values("t5-tiny", "bloom-tiny"),
                         [](const auto& info) {
                           return info.param == "t5-tiny" ? std::string("T5")
                                                          : std::string("Bloom");
                         });

// --- the public Engine ------------------------------------------------------------------------

class PublicEngineTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One folder per process: ctest runs this suite's tests as concurrent processes, and each
    // one's TearDownTestSuite removes its folder.
    dir_ =
        new std::string(std::string(KILN_TEST_TMP) + "/public_engine_" + std::to_string(getpid()));
    std::filesystem::create_directories(*dir_);
    Logger quiet(LogLevel::kError);
    BuildOptions o;
    write_plan(*dir_ + "/t5.plan", build_model(fixture("t5-tiny"), o, quiet),
               PlanBuildInfo{fixture("t5-tiny"), {}}, quiet);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string plan() { return *dir_ + "/t5.plan"; }
  static std::vector<std::string> prompts() {
    return {"reverse: suvogi", "add: 456 + 95", "copy: vica vica",
            "sort: f r t d e", "upper: lubu",   "count: fo va wa"};
  }
  // The Scheduler's results on the same plan: the expected output.
  static std::vector<GenerationResult> reference(const std::vector<std::string>& ps,
                                                 const GenerationParams& p) {
    Context ctx(ContextOptions{LogLevel::kError, 2});
    auto model = CompiledModel::load_plan(ctx, plan());
    std::vector<std::vector<int64_t>> ids;
    for (const std::string& s : ps) ids.push_back(model->tokenizer().encode(s));
    Scheduler s(*model, SchedulerOptions{});
    return s.generate(ids, p);
  }
  static std::string* dir_;
};
std::string* PublicEngineTest::dir_ = nullptr;

TEST_F(PublicEngineTest, GenerateFromSeveralThreadsGivesEachItsOwnResult) {
  auto engine = Engine::load(plan(), EngineOptions{2, 4, false});
  GenerationParams p = engine->default_params();
  p.max_new_tokens = 16;
  const auto ps = prompts();
  const auto want = reference(ps, p);
  std::vector<std::vector<TextResult>> got(3);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] { got[t] = engine->generate(ps, p); });
  for (auto& th : threads) th.join();
  for (const auto& results : got) {
    ASSERT_EQ(results.size(), ps.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(results[i].generation.output_ids, want[i].output_ids) << ps[i];
      EXPECT_EQ(results[i].text, engine->decode(want[i].output_ids)) << ps[i];
      EXPECT_EQ(results[i].input_ids, engine->encode(ps[i]));
    }
  }
}

TEST_F(PublicEngineTest, SubmitStreamsTheTextInPieces) {
  auto engine = Engine::load(plan(), EngineOptions{2, 4, false});
  GenerationParams p = engine->default_params();
  p.max_new_tokens = 12;
  const auto want = reference({"reverse: suvogi"}, p)[0];
  auto request = engine->submit("reverse: suvogi", p);
  std::string text;
  std::vector<int64_t> ids;
  int pieces = 0;
  TextChunk chunk;
  while (request->next(chunk)) {
    text += chunk.text;
    ids.insert(ids.end(), chunk.token_ids.begin(), chunk.token_ids.end());
    ++pieces;
    if (chunk.finished) {
      EXPECT_EQ(chunk.finish_reason, want.finish_reason);
    }
  }
  EXPECT_FALSE(request->next(chunk)) << "nothing after the last chunk";
  EXPECT_EQ(ids, want.output_ids);
  EXPECT_EQ(text, engine->decode(want.output_ids));
  EXPECT_GE(pieces, 2);
}

TEST_F(PublicEngineTest, StopStringsAndCancel) {
  auto engine = Engine::load(plan(), EngineOptions{2, 4, false});
  GenerationParams p = engine->default_params();
  p.max_new_tokens = 24;
  p.ignore_eos = true;
  const std::string full = engine->decode(reference({"copy: vica vica"}, p)[0].output_ids);
  ASSERT_GE(full.size(), 6u);
  const std::string stop = full.substr(full.size() / 2, 2);
  GenerationParams with_stop = p;
  with_stop.stop_strings = {stop};
  const TextResult r = engine->generate({"copy: vica vica"}, with_stop)[0];
  EXPECT_EQ(r.text, full.substr(0, full.find(stop)));
  EXPECT_EQ(r.generation.finish_reason, FinishReason::kStop);

  GenerationParams endless = p;
  endless.max_new_tokens = 4000;
  auto request = engine->submit("reverse: suvogi", endless);
  TextChunk chunk;
  ASSERT_TRUE(request->next(chunk));
  request->cancel();
  const TextResult rest = request->wait();
  EXPECT_EQ(rest.generation.finish_reason, FinishReason::kCancelled);
  // A request dropped unread is cancelled, not left running: the engine still answers.
  engine->submit("add: 12 + 30", endless).reset();
  p.ignore_eos = false;
  p.max_new_tokens = 16;
  EXPECT_EQ(engine->generate({"add: 12 + 30"}, p)[0].generation.output_ids,
            reference({"add: 12 + 30"}, p)[0].output_ids);
}

TEST_F(PublicEngineTest, BadInputIsRefusedWithTheFieldNamed) {
  EngineOptions o{2, 1, false};
  o.max_queue = 0;
  auto engine = Engine::load(plan(), o);
  GenerationParams p = engine->default_params();
  p.num_beams = 0;
  try {
    engine->submit("x", p);
    FAIL() << "num_beams 0 accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("beams"), std::string::npos) << e.what();
  }
  p.num_beams = 1;
  p.max_new_tokens = 4000;
  p.ignore_eos = true;
  auto busy = engine->submit("reverse: suvogi", p);
  try {
    engine->submit("reverse: suvogi", p);
    FAIL() << "a request beyond max_batch + max_queue accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("queue is full"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Engine::load(plan(), EngineOptions{2, 0, false}), std::runtime_error);
}

}  // namespace
}  // namespace kiln::test
