// The scheduler's per-request state (private to scheduler.cc and scheduler_run_ahead.cc).
#pragma once

#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "runtime/beam_search.h"
#include "runtime/kv_cache.h"
#include "runtime/scheduler.h"

namespace kiln {

struct Scheduler::Beam {
  // Every token of the sequence: the prompt (decoder-only) or the start token (encoder-decoder),
  // then the generated ones. Positions [kv.length(), seq.size()) are still to be fed.
  std::vector<int64_t> seq;
  int64_t generated = 0;  // trailing tokens of seq that were generated
  SequenceKv kv;
  int64_t scheduled = 0;  // tokens fed this step
  int64_t row = -1;       // logits row this step
  int64_t pending() const { return static_cast<int64_t>(seq.size()) - kv.length(); }
};

struct Scheduler::Request {
  RequestId id = 0;
  GenerationParams params;
  int64_t max_new = 0;  // resolved from max_new_tokens or max_length
  std::vector<int64_t> prompt;
  std::shared_ptr<CrossKv> cross;  // encoder-decoder: shared by every beam
  std::vector<Beam> beams;
  std::optional<BeamSearch> beam_search;
  std::mt19937_64 rng;
  int64_t admitted = -1;   // admission order (preemption takes the youngest)
  bool done = false;       // finished, failed or cancelled: leaves the running batch
  bool preempted = false;  // blocks freed; goes back to the waiting queue
  std::vector<int64_t> generated_tokens() const {
    const Beam& b = beams.front();
    return {b.seq.end() - b.generated, b.seq.end()};
  }
};

}  // namespace kiln
