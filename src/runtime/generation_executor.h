// The executor: a Scheduler stepped by its own engine thread, for callers on other threads (a
// server's connections, the public Engine). TensorRT-LLM's Executor is the model: enqueue a
// request and get a stream of its responses, cancel it, read statistics.
//
// One engine thread owns the Scheduler and the model's kernels (the thread pool is not
// reentrant); it sleeps on a condition variable while nothing is queued or running, so an idle
// executor uses no CPU. Other threads only enqueue, cancel, read their ResponseStream and read
// the published ExecutorStats snapshot.
//
// Text is made on the engine thread: each request's ids are detokenized incrementally as they
// become final, and stop strings (GenerationParams::stop_strings) end a request where its text
// first contains one: the text before it is returned, the stop string and what follows are not
// (OpenAI's rule), and text that could still be the start of a stop string is held back until
// the next ids decide it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/scheduler.h"
#include "tokenizer/detokenizer.h"

namespace kiln {

using Clock = std::chrono::steady_clock;

// Counts of observations at or below each upper bound (the last bucket is +Inf), their sum
// and number: Prometheus' histogram, kept per bucket (not cumulative).
struct Histogram {
  std::vector<double> bounds;    // ascending upper bounds
  std::vector<int64_t> buckets;  // bounds.size() + 1 counts
  double sum = 0.0;
  int64_t count = 0;
  explicit Histogram(std::vector<double> upper_bounds = {});
  void observe(double value);
};

struct ExecutorOptions {
  SchedulerOptions scheduler;
  // Requests that may wait beyond the max_batch running ones; another is refused with
  // QueueFullError. Negative: no limit.
  int64_t max_queue = -1;
  // How long a request may wait for its first step, and run in all, unless the request sets
  // its own; zero: no limit.
  std::chrono::microseconds queue_timeout{0};
  std::chrono::microseconds request_timeout{0};
  // Triton's max_queue_delay: when a request arrives at an idle executor, the first step waits
  // up to this long for more to start together (until max_batch are queued). Zero: no wait;
  // once running, requests join at every step anyway (continuous batching).
  std::chrono::microseconds batch_delay{0};
  std::string name = "model";  // in log lines and errors
};

// The executor cannot take a request now: its queue is full (HTTP 503, RESOURCE_EXHAUSTED).
class QueueFullError : public Error {
 public:
  explicit QueueFullError(std::string message)
      : Error(ErrorKind::kRuntime, std::move(message), __FILE__, __LINE__) {}
};

struct RequestOptions {
  // Deadlines for the first step and for the whole request (time_point::max(): the executor's
  // default timeouts apply).
  Clock::time_point queue_deadline = Clock::time_point::max();
  Clock::time_point deadline = Clock::time_point::max();
  std::string tag;  // copied to the RequestRecord (the server: the protocol)
};

enum class EndCause { kNone, kFinished, kCancelled, kQueueTimeout, kTimeout, kError };

// A piece of a request's response. Pieces arrive in order; the last has `finished` set.
struct ResponseChunk {
  std::vector<int64_t> token_ids;  // ids that became final (beam search: all, at the end)
  std::string text;                // their text (see the header comment on holding back)
  Clock::time_point time;          // when the engine thread produced it
  bool finished = false;
  // Set when finished:
  FinishReason finish_reason = FinishReason::kLength;
  EndCause cause = EndCause::kNone;
  std::string error;  // non-empty for kQueueTimeout, kTimeout and kError
  float score = 0.0f;
};

// What the executor recorded about a finished request (ExecutorOptions observers, request logs).
struct RequestRecord {
  RequestId id = 0;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  Clock::time_point queued, first_token, finished;  // first_token: epoch when none came
  FinishReason finish_reason = FinishReason::kLength;
  EndCause cause = EndCause::kNone;
  std::string error;
  std::string tag;  // RequestOptions::tag
};

// One request's responses, written by the engine thread and read by one other thread.
class ResponseStream {
 public:
  RequestId id() const { return id_; }
  Clock::time_point queued_at() const { return queued_; }
  // Waits until chunks are ready (or `until` passes) and moves them to the end of `out`.
  // Returns false once the final chunk has been read: nothing more will come.
  bool next(std::vector<ResponseChunk>& out, Clock::time_point until = Clock::time_point::max());
  bool finished() const;

 private:
  friend class GenerationExecutor;
  void push(ResponseChunk chunk);

  RequestId id_ = 0;
  Clock::time_point queued_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<ResponseChunk> chunks_;
  bool ended_ = false;  // the final chunk was pushed
  bool read_end_ = false;
};

// A snapshot of an executor's state and counters since it started, published after every step.
struct ExecutorStats {
  int64_t pending = 0;  // enqueued, not finished (waiting + running)
  int64_t running = 0;  // sequences in the running batch
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_budget = 0;  // 0: no limit (the KV cache grows on demand)
  int64_t kv_bytes_allocated = 0;
  int64_t steps = 0;  // decoder steps run (Triton's execution count)
  int64_t preemptions = 0;
  int64_t steps_ahead = 0;    // of them, queued before the tokens of the step before were read
  int64_t encoder_steps = 0;  // encoder steps (encoder-decoder models)
  // How the decoder's and the encoder's steps were launched (CUDA graphs replayed, captured, or
  // kernel by kernel).
  StepLaunchStats decoder_launches, encoder_launches;
  int64_t last_batch = 0;  // sequences in the last step
  // Requests by how they ended; rejected: refused at enqueue (queue full).
  int64_t success = 0, cancelled = 0, queue_timeouts = 0, timeouts = 0, errors = 0, rejected = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  // Totals in microseconds over finished requests: queue (enqueue → first step's tokens or end),
  // compute (first tokens → end) and the whole.
  int64_t queue_us = 0, compute_us = 0, request_us = 0;
  int64_t busy_us = 0;             // engine thread time spent in steps
  Clock::time_point last_request;  // when the last request finished (epoch: never)
  Histogram ttft_seconds, inter_token_seconds, output_tokens_per_request, batch_size;
};

class GenerationExecutor {
 public:
  // Starts the engine thread. `model` must outlive the executor; nothing else may step it.
  GenerationExecutor(CompiledModel& model, ExecutorOptions options);
  // Cancels whatever is still in flight and joins the engine thread.
  ~GenerationExecutor();
  GenerationExecutor(const GenerationExecutor&) = delete;
  GenerationExecutor& operator=(const GenerationExecutor&) = delete;

  // Validates (usage errors throw here, naming the field), then queues the request. Throws
  // QueueFullError when max_queue requests already wait, and an Error once stopping.
  std::shared_ptr<ResponseStream> enqueue(std::vector<int64_t> prompt_ids,
                                          const GenerationParams& params,
                                          const RequestOptions& options = {});
  // Ends the request before the next step (its KV blocks are freed then); its stream gets a
  // final chunk with EndCause::kCancelled. Unknown or finished ids are ignored.
  void cancel(RequestId id);
  ExecutorStats stats() const;
  // Called on the engine thread for every finished request (set before enqueueing).
  void set_observer(std::function<void(const RequestRecord&)> observer);
  // Refuses new requests from now on; waits until those in flight finish or `until` passes,
  // then cancels the rest. Returns whether everything finished.
  bool drain(Clock::time_point until);
  // Requests in flight (queued or running).
  int64_t in_flight() const { return in_flight_.load(); }
  CompiledModel& model() { return model_; }

 private:
  struct Live;
  void loop();
  void deliver(GenerationEvent& event, Clock::time_point now);
  void end(Live& live, ResponseChunk last, Clock::time_point now);
  void check_deadlines(Clock::time_point now);
  void publish(int64_t step_us);
  bool push_text(Live& live, const std::vector<int64_t>& ids, ResponseChunk& chunk);
  std::vector<RequestId> live_ids_snapshot() const;

  CompiledModel& model_;
  ExecutorOptions options_;
  Scheduler scheduler_;

  mutable std::mutex mutex_;  // guards the fields below up to stats_
  std::condition_variable wake_;
  bool stopping_ = false;   // drain() or the destructor: no new requests
  bool quit_ = false;       // the engine thread leaves its loop
  bool submitted_ = false;  // something was enqueued or cancelled since the last step
  std::vector<std::unique_ptr<Live>> incoming_;
  std::vector<RequestId> cancels_;
  ExecutorStats stats_;
  int64_t counters_rejected_ = 0;
  std::vector<RequestId> live_ids_;  // the engine thread's live_, as of the last step
  std::function<void(const RequestRecord&)> observer_;
  std::condition_variable drained_;

  std::atomic<int64_t> in_flight_{0};
  // Engine thread only.
  bool cleanup_ = false;  // ended requests' cancellations wait for the scheduler's next step
  std::map<RequestId, std::unique_ptr<Live>> live_;
  ExecutorStats counters_;
  std::thread thread_;
};

// The finish reason's name in APIs: "stop" (EOS or a stop string), "length", "cancelled".
const char* finish_reason_name(FinishReason reason);

}  // namespace kiln
