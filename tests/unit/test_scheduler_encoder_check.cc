// A backend that runs ahead (CUDA) leaves a batch's encoder step unchecked and reports its bad
// data with the first decode step's read (StepContext::read_on_device). When that check fails,
// the scheduler must not trust the batch's cross K/V: each request is encoded again, checked,
// and runs alone; one whose encoder fails again gets an error, the others the tokens of a clean
// run. The same when the prompts take several encoder batches (only the last is left unchecked).
// The device is played by the CPU backend wrapped so that it defers an injected encoder error the
// way CUDA defers a kernel's report (thrown by the next read, wait or step that is not queued
// behind it).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "../models/parity_util.h"
#include "builder/builder.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

class DeferringBackend final : public Backend {
 public:
  explicit DeferringBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  // The next `n` encoder steps report bad data: deferred when read on the device, thrown at
  // once when checked.
  void fail_encoder_steps(int n) { failures_ = n; }
  int injected() const { return injected_; }
  int encoder_steps() const { return encoder_steps_; }
  // Plays a backend that replays steps of up to `tokens` tokens (CUDA's graphs).
  void set_replayed(int64_t tokens) { replayed_ = tokens; }
  // The tokens and sequences of every encoder step so far.
  const std::vector<std::pair<int64_t, int>>& encoder_shapes() const { return encoder_shapes_; }

  // What a CUDA read or wait does first: a pending report is thrown (and cleared).
  void throw_pending() {
    if (pending_.empty()) return;
    const std::string message = std::move(pending_);
    pending_.clear();
    KILN_FAIL("{}", message);
  }

  Device device() const override { return inner_->device(); }
  std::string describe() const override { return "deferring " + inner_->describe(); }
  std::string target() const override { return inner_->target(); }
  std::string unsupported_reason(const Graph& graph, const Node& node) const override {
    return inner_->unsupported_reason(graph, node);
  }
  std::unique_ptr<Executable> compile(const Graph& graph, const ShapeProfile& profile) override {
    return std::make_unique<Step>(*this, inner_->compile(graph, profile));
  }
  Allocator& allocator() override { return inner_->allocator(); }
  std::unique_ptr<KvStorage> create_kv_storage(const KvGeometry& geometry) override {
    return inner_->create_kv_storage(geometry);
  }
  DType kv_cache_dtype(DType compute, Precision precision, KvCache kv) const override {
    return inner_->kv_cache_dtype(compute, precision, kv);
  }
  TokenSelector& token_selector() override { return selector_; }
  bool runs_ahead() const override { return true; }
  int64_t replayed_step_tokens() const override { return replayed_; }
  void wait() override { throw_pending(); }

 private:
  // The inner backend's argmax, behind the pending report a device read would throw first.
  class Selector final : public TokenSelector {
   public:
    explicit Selector(DeferringBackend& owner) : owner_(owner) {}
    bool argmax_rows(const Tensor& logits, std::span<int64_t> out, std::span<const int64_t> banned,
                     std::span<const uint8_t> banned_rows) override {
      owner_.throw_pending();
      return owner_.inner_->token_selector().argmax_rows(logits, out, banned, banned_rows);
    }
    void finish_argmax_rows(std::span<int64_t> out) override {
      owner_.throw_pending();
      TokenSelector::finish_argmax_rows(out);
    }

   private:
    DeferringBackend& owner_;
  };
  Selector selector_{*this};
  class Step final : public Executable {
   public:
    Step(DeferringBackend& owner, std::unique_ptr<Executable> inner)
        : owner_(owner), inner_(std::move(inner)) {}
    std::span<const Tensor> execute(std::span<const Tensor> inputs,
                                    const StepContext* step) override {
      const bool encoder = step != nullptr && step->kv == nullptr;
      owner_.encoder_steps_ += encoder;
      if (encoder)
        owner_.encoder_shapes_.emplace_back(step->layout->total_tokens(), step->layout->num_seqs());
      if (step == nullptr || !step->behind_unread) owner_.throw_pending();
      const bool inject = encoder && owner_.failures_ > 0;
      // The bad data is real: every output (the cross K/V) is garbage, so that a request run on
      // it would not produce a clean run's tokens. A streamed output is spoiled on its way to
      // the step's sink, the others after the step.
      GarbageSink garbage(step != nullptr ? step->sink : nullptr);
      StepContext spoiled = step != nullptr ? *step : StepContext{};
      if (inject && spoiled.sink != nullptr) spoiled.sink = &garbage;
      std::span<const Tensor> out = inner_->execute(inputs, step != nullptr ? &spoiled : nullptr);
      if (inject) {
        --owner_.failures_;
        ++owner_.injected_;
        for (const Tensor& t : out) spoil(t);
        const std::string report = "node 'encoder': injected bad data";
        if (!step->read_on_device) KILN_FAIL("{}", report);
        owner_.pending_ = report;
      }
      return out;
    }
    int64_t workspace_bytes() const override { return inner_->workspace_bytes(); }
    std::vector<std::string> kernel_names() const override { return inner_->kernel_names(); }
    void set_observer(ActivationObserver observer) override {
      inner_->set_observer(std::move(observer));
    }

   private:
    static void spoil(Tensor t) {
      if (t.defined() && t.dtype() == DType::kF32) std::fill_n(t.data<float>(), t.numel(), 1e4f);
    }
    class GarbageSink final : public OutputSink {
     public:
      explicit GarbageSink(OutputSink* inner) : inner_(inner) {}
      void take(int output, const Tensor& value) override {
        spoil(value);
        inner_->take(output, value);
      }

     private:
      OutputSink* inner_;
    };
    DeferringBackend& owner_;
    std::unique_ptr<Executable> inner_;
  };

  std::unique_ptr<Backend> inner_;
  int failures_ = 0;
  int injected_ = 0;
  int encoder_steps_ = 0;
  int64_t replayed_ = 0;
  std::vector<std::pair<int64_t, int>> encoder_shapes_;
  std::string pending_;
};

struct Outcome {
  std::vector<int64_t> ids;
  std::string error;
};

class EncoderCheck : public testing::Test {
 protected:
  void SetUp() override {
    ctx_ = std::make_unique<Context>(ContextOptions{LogLevel::kError, 2});
    auto backend = std::make_unique<DeferringBackend>(make_cpu_backend(*ctx_));
    backend_ = backend.get();
    model_ = std::make_unique<CompiledModel>(
        *ctx_, build_model(fixture("t5-tiny"), BuildOptions{}, ctx_->log()), std::move(backend));
  }
  // Submits every prompt at once and steps until each has finished.
  std::vector<Outcome> run(const std::vector<std::string>& prompts, SchedulerOptions o = {}) {
    Scheduler s(*model_, o);
    std::map<RequestId, size_t> index;
    GenerationParams p;
    p.max_new_tokens = 8;
    for (size_t i = 0; i < prompts.size(); ++i)
      index[s.submit(model_->tokenizer().encode(prompts[i]), p)] = i;
    std::vector<Outcome> out(prompts.size());
    size_t done = 0;
    for (int call = 0; done < prompts.size() && call < 1000; ++call)
      for (GenerationEvent& e : s.step()) {
        if (!e.finished) continue;
        Outcome& o = out[index.at(e.id)];
        o.error = e.error;
        o.ids = e.result.output_ids;
        ++done;
      }
    EXPECT_EQ(done, prompts.size()) << "the scheduler does not finish";
    EXPECT_EQ(s.kv_blocks_in_use(), 0);
    return out;
  }

  const std::vector<std::string> prompts_{"translate English to German: The house is wonderful.",
                                          "What is the capital of France?",
                                          "summarize: the cat sat on the mat all day long"};
  std::unique_ptr<Context> ctx_;
  DeferringBackend* backend_ = nullptr;
  std::unique_ptr<CompiledModel> model_;
};

TEST_F(EncoderCheck, AFailedDeferredCheckEncodesEachRequestAgain) {
  const std::vector<Outcome> clean = run(prompts_);
  for (const Outcome& o : clean) ASSERT_TRUE(o.error.empty()) << o.error;
  // The batch's one encoder step fails its check, reported by the first decode step's read.
  backend_->fail_encoder_steps(1);
  const std::vector<Outcome> got = run(prompts_);
  EXPECT_EQ(backend_->injected(), 1);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].error.empty()) << "request " << i << ": " << got[i].error;
    EXPECT_EQ(got[i].ids, clean[i].ids) << "request " << i << " ran on untrusted cross K/V";
  }
}

TEST_F(EncoderCheck, ARequestWhoseEncoderFailsAgainGetsTheError) {
  const std::vector<Outcome> clean = run(prompts_);
  // The batch's step, then the first request's checked step alone.
  backend_->fail_encoder_steps(2);
  const std::vector<Outcome> got = run(prompts_);
  EXPECT_EQ(backend_->injected(), 2);
  EXPECT_NE(got[0].error.find("injected bad data"), std::string::npos) << got[0].error;
  for (size_t i = 1; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].error.empty()) << "request " << i << ": " << got[i].error;
    EXPECT_EQ(got[i].ids, clean[i].ids) << "request " << i;
  }
}

// Prompts beyond the step's token budget are encoded in several batches: only the last is left
// unchecked, and an earlier one whose check fails (made before the next batch runs) has its
// requests encoded again alone.
TEST_F(EncoderCheck, AnEarlierBatchOfTheSameStepIsCheckedAndRedone) {
  SchedulerOptions one_prompt_a_batch;
  one_prompt_a_batch.max_batch = 3;
  one_prompt_a_batch.max_step_tokens = 4;  // each prompt is longer: one encoder batch each
  const std::vector<Outcome> clean = run(prompts_, one_prompt_a_batch);
  for (const Outcome& o : clean) ASSERT_TRUE(o.error.empty()) << o.error;
  ASSERT_EQ(backend_->encoder_steps(), 3) << "the prompts were not encoded one batch each";
  backend_->fail_encoder_steps(1);
  const std::vector<Outcome> got = run(prompts_, one_prompt_a_batch);
  EXPECT_EQ(backend_->injected(), 1);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].error.empty()) << "request " << i << ": " << got[i].error;
    EXPECT_EQ(got[i].ids, clean[i].ids) << "request " << i;
  }
}

// Where the backend keeps state per step shape (CUDA's graphs and cuBLASLt choices), encoder
// steps are padded to a multiple of SchedulerOptions::encode_pad_tokens with a sequence of pad
// tokens whose outputs are dropped: the requests get the tokens of unpadded steps, and the padded
// step's failure is isolated as any other.
TEST_F(EncoderCheck, EncoderStepsArePaddedToReplayedShapes) {
  int64_t prompt_tokens = 0;
  for (const std::string& p : prompts_)
    prompt_tokens += static_cast<int64_t>(model_->tokenizer().encode(p).size());
  ASSERT_NE(prompt_tokens % 32, 0) << "the test needs prompts that a 32-token bucket pads";
  backend_->set_replayed(256);
  SchedulerOptions unpadded;
  unpadded.encode_pad_tokens = 0;
  const std::vector<Outcome> clean = run(prompts_, unpadded);
  ASSERT_EQ(backend_->encoder_shapes().size(), 1u);
  EXPECT_EQ(backend_->encoder_shapes()[0], std::make_pair(prompt_tokens, 3));

  SchedulerOptions pad32;
  pad32.encode_pad_tokens = 32;
  const std::vector<Outcome> padded = run(prompts_, pad32);
  ASSERT_EQ(backend_->encoder_shapes().size(), 2u);
  EXPECT_EQ(backend_->encoder_shapes()[1], std::make_pair((prompt_tokens + 31) / 32 * 32, 4))
      << "one sequence of pad tokens up to the next multiple of 32";
  for (size_t i = 0; i < padded.size(); ++i) {
    EXPECT_TRUE(padded[i].error.empty()) << padded[i].error;
    EXPECT_EQ(padded[i].ids, clean[i].ids) << "request " << i;
  }
  // The padded step fails its deferred check: each request is encoded again alone (padded too)
  // and gets a clean run's tokens.
  backend_->fail_encoder_steps(1);
  const std::vector<Outcome> retried = run(prompts_, pad32);
  for (size_t i = 0; i < retried.size(); ++i) {
    EXPECT_TRUE(retried[i].error.empty()) << retried[i].error;
    EXPECT_EQ(retried[i].ids, clean[i].ids) << "request " << i;
  }
  for (size_t k = 2; k < backend_->encoder_shapes().size(); ++k)
    EXPECT_EQ(backend_->encoder_shapes()[k].first % 32, 0) << "encoder step " << k;

  // Steps longer than the backend replays are padded too (CUDA chooses each Linear's cuBLASLt
  // algorithm per row count: recurring shapes reuse the choices).
  backend_->set_replayed(8);
  run(prompts_, pad32);
  EXPECT_EQ(backend_->encoder_shapes().back(), std::make_pair((prompt_tokens + 31) / 32 * 32, 4));

  // A backend that replays nothing gets steps of the prompts' tokens.
  backend_->set_replayed(0);
  run(prompts_, pad32);
  EXPECT_EQ(backend_->encoder_shapes().back(), std::make_pair(prompt_tokens, 3));
}

}  // namespace
}  // namespace kiln::test
