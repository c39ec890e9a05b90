// GenerationExecutor: the engine thread's loop, response streams, stop strings, deadlines and
// the published statistics.
#include "runtime/generation_executor.h"

#include <algorithm>

namespace kiln {

namespace {

// Prometheus-style bucket bounds: latencies from 1 ms to 60 s, token counts up to 8192,
// batch sizes up to 256.
std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}
std::vector<double> token_bounds() { return {1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 8192}; }
std::vector<double> batch_bounds() { return {1, 2, 4, 8, 16, 32, 64, 128, 256}; }

int64_t micros(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::microseconds>(d).count();
}
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The longest suffix of `text` that is a proper prefix of one of `stops`: text that the next
// ids could turn into a stop string, and so is held back.
size_t stop_prefix_suffix(const std::string& text, size_t from,
                          const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops) {
    const size_t most = std::min(s.size() - 1, text.size() - from);
    for (size_t k = most; k > best; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        best = k;
        break;
      }
  }
  return best;
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds(std::move(upper_bounds)), buckets(bounds.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin());
  ++buckets[i];
  sum += value;
  ++count;
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos:
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

// --- ResponseStream ----------------------------------------------------------------------------

bool ResponseStream::next(std::vector<ResponseChunk>& out, Clock::time_point until) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (read_end_) return false;
  ready_.wait_until(lock, until, [&] { return !chunks_.empty(); });
  for (ResponseChunk& c : chunks_) {
    if (c.finished) read_end_ = true;
    out.push_back(std::move(c));
  }
  chunks_.clear();
  return true;
}

bool ResponseStream::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ended_;
}

void ResponseStream::push(ResponseChunk chunk) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ended_) return;
    ended_ = chunk.finished;
    chunks_.push_back(std::move(chunk));
  }
  ready_.notify_all();
}

// --- GenerationExecutor --------------------------------------------------------------------------

struct GenerationExecutor::Live {
  std::shared_ptr<ResponseStream> stream;
  RequestId id = 0;
  int64_t input_tokens = 0;
  std::vector<std::string> stops;
  std::unique_ptr<IncrementalDetokenizer> detok;  // null for beam search (text at the end)
  std::string text;                               // generated text so far (greedy/sampling)
  size_t emitted = 0;                             // bytes of text sent
  int64_t output_tokens = 0;
  Clock::time_point queued, first_token, last_token;
  Clock::time_point queue_deadline, deadline;
  bool waiting = true;  // not admitted yet (as of the last step)
  std::string tag;
};

GenerationExecutor::GenerationExecutor(CompiledModel& model, ExecutorOptions options)
    : model_(model), options_(std::move(options)), scheduler_(model, options_.scheduler) {
  auto fresh = [] {
    ExecutorStats s;
    s.ttft_seconds = Histogram(latency_bounds());
    s.inter_token_seconds = Histogram(latency_bounds());
    s.output_tokens_per_request = Histogram(token_bounds());
    s.batch_size = Histogram(batch_bounds());
    s.kv_blocks_budget = 0;
    return s;
  };
  counters_ = fresh();
  counters_.kv_blocks_budget = options_.scheduler.kv_budget_blocks;
  stats_ = counters_;
  thread_ = std::thread([this] { loop(); });
}

GenerationExecutor::~GenerationExecutor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    quit_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GenerationExecutor::set_observer(std::function<void(const RequestRecord&)> observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  observer_ = std::move(observer);
}

std::shared_ptr<ResponseStream> GenerationExecutor::enqueue(std::vector<int64_t> prompt_ids,
                                                            const GenerationParams& params,
                                                            const RequestOptions& options) {
  validate(params, model_.desc().vocab_size);
  auto live = std::make_unique<Live>();
  live->stops = params.stop_strings;
  GenerationParams p = params;
  p.stop_strings.clear();  // applied here, on the text
  if (p.num_beams == 1) live->detok = std::make_unique<IncrementalDetokenizer>(model_.tokenizer());
  live->input_tokens = static_cast<int64_t>(prompt_ids.size());
  live->tag = options.tag;
  live->queued = Clock::now();
  auto limit = [&](Clock::time_point given, std::chrono::microseconds dflt) {
    if (given != Clock::time_point::max() || dflt.count() <= 0) return given;
    return live->queued + dflt;
  };
  live->queue_deadline = limit(options.queue_deadline, options_.queue_timeout);
  live->deadline = limit(options.deadline, options_.request_timeout);
  live->stream = std::make_shared<ResponseStream>();
  live->stream->queued_ = live->queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    KILN_CHECK(!stopping_, "{}: the server is shutting down and takes no new requests",
               options_.name);
    const int64_t capacity =
        options_.max_queue < 0 ? INT64_MAX : options_.scheduler.max_batch + options_.max_queue;
    if (in_flight_.load() >= capacity) {
      ++counters_rejected_;
      throw QueueFullError(fmt::format(
          "{}: the queue is full ({} requests running or waiting, max_queue_size {}); retry "
          "later",
          options_.name, in_flight_.load(), options_.max_queue));
    }
    // Submitted under the lock, so that the engine thread finds the request among incoming_
    // whenever its events come (the step that drains the scheduler's inbox is followed by a
    // look at incoming_).
    live->id = scheduler_.submit(std::move(prompt_ids), p);
    live->stream->id_ = live->id;
    ++in_flight_;
    incoming_.push_back(std::move(live));
    submitted_ = true;
    auto stream = incoming_.back()->stream;
    wake_.notify_all();
    return stream;
  }
}

void GenerationExecutor::cancel(RequestId id) {
  scheduler_.cancel(id);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    submitted_ = true;
  }
  wake_.notify_all();
}

ExecutorStats GenerationExecutor::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ExecutorStats s = stats_;
  s.rejected = counters_rejected_;
  s.pending = in_flight_.load();
  return s;
}

bool GenerationExecutor::drain(Clock::time_point until) {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  const bool done = drained_.wait_until(lock, until, [&] { return in_flight_.load() == 0; });
  if (done) return true;
  lock.unlock();
  // Cancel what is left; the engine thread ends each with a final chunk.
  std::vector<RequestId> ids;
  {
    std::lock_guard<std::mutex> l(mutex_);
    for (auto& live : incoming_) ids.push_back(live->id);
  }
  for (RequestId id : live_ids_snapshot()) ids.push_back(id);
  for (RequestId id : ids) cancel(id);
  std::unique_lock<std::mutex> again(mutex_);
  drained_.wait_for(again, std::chrono::seconds(5), [&] { return in_flight_.load() == 0; });
  return false;
}

std::vector<RequestId> GenerationExecutor::live_ids_snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_ids_;
}

void GenerationExecutor::loop() {
  const Logger& log = model_.context().log();
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Sleep while nothing is queued or running: an idle server uses no CPU.
      // (cleanup_: a request this thread ended holds KV blocks until the scheduler's next step.)
      wake_.wait(lock, [&] {
        return quit_ || submitted_ || cleanup_ || !live_.empty() || !incoming_.empty();
      });
      if (quit_) break;
      // Starting from idle: give the requests arriving together a moment to start together.
      if (live_.empty() && options_.batch_delay.count() > 0) {
        const Clock::time_point until = Clock::now() + options_.batch_delay;
        wake_.wait_until(lock, until, [&] {
          return quit_ || static_cast<int>(incoming_.size()) >= options_.scheduler.max_batch;
        });
        if (quit_) break;
      }
      submitted_ = false;
      cleanup_ = false;
    }
    const Clock::time_point start = Clock::now();
    std::vector<GenerationEvent> events;
    std::string failure;
    try {
      events = scheduler_.step();
    } catch (const std::exception& e) {
      // A failed step (a kernel error) fails what is in flight, not the server.
      failure = e.what();
    }
    const Clock::time_point now = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& live : incoming_) live_.emplace(live->id, std::move(live));
      incoming_.clear();
    }
    if (!failure.empty()) {
      log.warn("{}: a generation step failed: {}; failing the {} requests in flight", options_.name,
               failure, live_.size());
      std::vector<RequestId> ids;
      for (auto& [id, live] : live_) ids.push_back(id);
      for (RequestId id : ids) {
        scheduler_.cancel(id);
        cleanup_ = true;
        ResponseChunk last;
        last.cause = EndCause::kError;
        last.finish_reason = FinishReason::kCancelled;
        last.error = "generation failed: " + failure;
        end(*live_.at(id), std::move(last), now);
      }
      publish(micros(now - start));
      continue;
    }
    for (GenerationEvent& e : events) deliver(e, now);
    check_deadlines(now);
    publish(micros(now - start));
  }
  // Leaving (destructor): whatever is still in flight ends cancelled.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& live : incoming_) live_.emplace(live->id, std::move(live));
    incoming_.clear();
  }
  const Clock::time_point now = Clock::now();
  std::vector<RequestId> ids;
  for (auto& [id, live] : live_) ids.push_back(id);
  for (RequestId id : ids) {
    ResponseChunk last;
    last.cause = EndCause::kCancelled;
    last.finish_reason = FinishReason::kCancelled;
    end(*live_.at(id), std::move(last), now);
  }
}

// Appends the text of `ids` to the request's text; returns true when a stop string completed
// (then chunk.text ends before it). Otherwise chunk.text is what may be sent now.
bool GenerationExecutor::push_text(Live& live, const std::vector<int64_t>& ids,
                                   ResponseChunk& chunk) {
  for (int64_t id : ids) live.text += live.detok->push(id);
  if (!live.stops.empty()) {
    // A stop string can only start in text not sent yet: what was sent never ended in a
    // prefix of one.
    size_t hit = std::string::npos;
    for (const std::string& s : live.stops) hit = std::min(hit, live.text.find(s, live.emitted));
    if (hit != std::string::npos) {
      chunk.text = live.text.substr(live.emitted, hit - live.emitted);
      live.text.resize(hit);
      live.emitted = hit;
      return true;
    }
  }
  const size_t hold = stop_prefix_suffix(live.text, live.emitted, live.stops);
  const size_t upto = live.text.size() - hold;
  chunk.text = live.text.substr(live.emitted, upto - live.emitted);
  live.emitted = upto;
  return false;
}

void GenerationExecutor::deliver(GenerationEvent& e, Clock::time_point now) {
  auto it = live_.find(e.id);
  if (it == live_.end()) return;  // ended here already (stop string, deadline): a late event
  Live& live = *it->second;
  if (!e.new_tokens.empty()) {
    if (live.output_tokens == 0) {
      live.first_token = now;
      counters_.ttft_seconds.observe(seconds(now - live.queued));
    } else if (live.detok) {
      // One gap per step, spread over the tokens it made final (run-ahead delivers two at once).
      const double gap = seconds(now - live.last_token) / static_cast<double>(e.new_tokens.size());
      for (size_t i = 0; i < e.new_tokens.size(); ++i) counters_.inter_token_seconds.observe(gap);
    }
    live.last_token = now;
    live.output_tokens += static_cast<int64_t>(e.new_tokens.size());
    live.waiting = false;
  }
  ResponseChunk chunk;
  chunk.time = now;
  chunk.token_ids = e.new_tokens;
  if (live.detok) {
    if (push_text(live, e.new_tokens, chunk)) {
      // A stop string: the request ends here; the scheduler frees its blocks at the next step
      // (its cancelled event finds no live request).
      scheduler_.cancel(live.id);
      cleanup_ = true;
      chunk.finish_reason = FinishReason::kStop;
      chunk.cause = EndCause::kFinished;
      end(live, std::move(chunk), now);
      return;
    }
  } else if (e.finished && e.error.empty()) {
    chunk.text = model_.tokenizer().decode(e.result.output_ids);
  }
  if (!e.finished) {
    if (!chunk.token_ids.empty() || !chunk.text.empty()) live.stream->push(std::move(chunk));
    return;
  }
  if (!e.error.empty()) {
    chunk.cause = EndCause::kError;
    chunk.error = e.error;
    chunk.finish_reason = FinishReason::kCancelled;
  } else {
    if (live.detok) {
      // What the detokenizer held back (an unfinished character) is final now.
      live.text += live.detok->finish();
      chunk.text += live.text.substr(live.emitted);
      live.emitted = live.text.size();
    }
    chunk.finish_reason = e.result.finish_reason;
    chunk.cause = e.result.finish_reason == FinishReason::kCancelled ? EndCause::kCancelled
                                                                     : EndCause::kFinished;
    chunk.score = e.result.score;
  }
  end(live, std::move(chunk), now);
}

void GenerationExecutor::end(Live& live, ResponseChunk last, Clock::time_point now) {
  last.finished = true;
  last.time = now;
  RequestRecord rec;
  rec.id = live.id;
  rec.input_tokens = live.input_tokens;
  rec.output_tokens = live.output_tokens;
  rec.queued = live.queued;
  rec.first_token = live.first_token;
  rec.finished = now;
  rec.finish_reason = last.finish_reason;
  rec.cause = last.cause;
  rec.error = last.error;
  rec.tag = live.tag;
  switch (last.cause) {
    case EndCause::kFinished:
      ++counters_.success;
      break;
    case EndCause::kCancelled:
      ++counters_.cancelled;
      break;
    case EndCause::kQueueTimeout:
      ++counters_.queue_timeouts;
      break;
    case EndCause::kTimeout:
      ++counters_.timeouts;
      break;
    case EndCause::kError:
    case EndCause::kNone:
      ++counters_.errors;
      break;
  }
  counters_.input_tokens += live.input_tokens;
  counters_.output_tokens += live.output_tokens;
  const Clock::time_point started =
      live.first_token == Clock::time_point{} ? now : live.first_token;
  counters_.queue_us += micros(started - live.queued);
  counters_.compute_us += micros(now - started);
  counters_.request_us += micros(now - live.queued);
  counters_.last_request = now;
  if (last.cause == EndCause::kFinished)
    counters_.output_tokens_per_request.observe(static_cast<double>(live.output_tokens));
  live.stream->push(std::move(last));
  std::function<void(const RequestRecord&)> observer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    observer = observer_;
  }
  if (observer) observer(rec);
  live_.erase(live.id);  // `live` is gone from here on
  {
    std::lock_guard<std::mutex> lock(mutex_);  // drain() waits on it
    --in_flight_;
  }
  drained_.notify_all();
}

void GenerationExecutor::check_deadlines(Clock::time_point now) {
  std::vector<std::pair<RequestId, EndCause>> expired;
  for (auto& [id, live] : live_) {
    if (live->waiting) live->waiting = scheduler_.is_waiting(id);
    if (now >= live->deadline)
      expired.emplace_back(id, EndCause::kTimeout);
    else if (live->waiting && now >= live->queue_deadline)
      expired.emplace_back(id, EndCause::kQueueTimeout);
  }
  for (auto [id, cause] : expired) {
    Live& live = *live_.at(id);
    scheduler_.cancel(id);
    cleanup_ = true;
    ResponseChunk last;
    last.cause = cause;
    last.finish_reason = FinishReason::kCancelled;
    const auto limit = cause == EndCause::kTimeout ? live.deadline : live.queue_deadline;
    last.error = fmt::format(
        "{}: the request timed out after {} ms {}", options_.name,
        micros(limit - live.queued) / 1000,
        cause == EndCause::kTimeout ? "(its total time limit)" : "waiting in the queue");
    end(live, std::move(last), now);
  }
}

void GenerationExecutor::publish(int64_t step_us) {
  counters_.steps = scheduler_.steps();
  counters_.preemptions = scheduler_.preemptions();
  counters_.steps_ahead = scheduler_.steps_ahead();
  counters_.encoder_steps = scheduler_.encoder_steps();
  counters_.decoder_launches = model_.decoder().launch_stats();
  if (model_.desc().encoder_decoder) counters_.encoder_launches = model_.encoder().launch_stats();
  counters_.running = static_cast<int64_t>(scheduler_.running());
  counters_.kv_blocks_used = scheduler_.kv_blocks_in_use();
  counters_.kv_bytes_allocated = scheduler_.kv_bytes_allocated();
  counters_.busy_us += step_us;
  if (counters_.running > 0) {
    counters_.last_batch = counters_.running;
    counters_.batch_size.observe(static_cast<double>(counters_.running));
  }
  std::vector<RequestId> ids;
  ids.reserve(live_.size());
  for (auto& [id, live] : live_) ids.push_back(id);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_ = counters_;
  live_ids_ = std::move(ids);
}

}  // namespace kiln
