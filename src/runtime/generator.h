// Iteration-level generation. Requests are submitted at any time and join the running batch at
// the next step; each step runs the encoder for newly joined encoder-decoder requests, then one
// decoder pass over every running sequence (prefill for new ones, one token for the others), and
// finished requests leave. Greedy, sampling and beam search (HF semantics) share the loop.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "kiln/engine.h"
#include "kiln/generate.h"
#include "runtime/kv_cache.h"

namespace kiln {

class Generator {
 public:
  using RequestId = int64_t;
  explicit Generator(Engine& engine);
  ~Generator();

  // Validates and queues a request; it joins the batch at the next step().
  RequestId submit(std::vector<int64_t> prompt_ids, const GenerationParams& params);
  // One iteration for every running request. Returns the number of sequences stepped.
  int step();
  bool idle() const { return waiting_.empty() && running_.empty(); }
  size_t running() const { return running_.size(); }
  // Results of requests that finished since the last call.
  std::vector<std::pair<RequestId, GenerationResult>> take_finished();

  // Convenience: submit all, step until done, results in prompt order.
  std::vector<GenerationResult> generate(const std::vector<std::vector<int64_t>>& prompts,
                                         const GenerationParams& params);

  const PagedKvCache& cache() const { return cache_; }

 private:
  struct Beam {
    std::vector<int64_t> tokens;  // generated so far
    std::vector<int64_t> feed;    // fed at the next step
    SequenceKv kv;
    float score = 0.0f;  // beam search: sum of log-probabilities
  };
  struct Hypothesis {
    std::vector<int64_t> tokens;
    float score;
    bool eos;
  };
  struct Request {
    RequestId id;
    GenerationParams params;
    std::vector<int64_t> prompt;
    std::shared_ptr<CrossKv> cross;  // encoder-decoder: shared by every beam
    std::vector<Beam> beams;
    std::vector<Hypothesis> finished;  // beam search
    std::mt19937_64 rng;
  };

  void admit_waiting();
  void advance(Request& r, const float* logits, int64_t vocab, int64_t first_row);
  void advance_beams(Request& r, const float* logits, int64_t vocab, int64_t first_row);
  void finish(Request& r, GenerationResult result);
  bool is_eos(int64_t token) const;

  Engine& engine_;
  PagedKvCache cache_;
  std::vector<int64_t> eos_ids_;
  RequestId next_id_ = 0;
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;
  std::vector<std::pair<RequestId, GenerationResult>> done_;
};

}  // namespace kiln
