#include "runtime/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>

#include "runtime/beam_search.h"
#include "runtime/logits_processors.h"
#include "runtime/sampler.h"
#include "runtime/scheduler_request.h"

namespace kiln {

static_assert(kMaxBeamsSetting == kMaxBeams, "a checkpoint's beam limit is the runtime's");

GenerationParams default_generation_params(const ModelDesc& desc) {
  GenerationParams p;
  const GenerationDefaults& g = desc.generation;
  if (g.max_new_tokens) {
    p.max_new_tokens = *g.max_new_tokens;
  } else if (g.max_length) {
    p.max_new_tokens = 0;
    p.max_length = *g.max_length;
  }
  if (g.min_new_tokens) p.min_new_tokens = *g.min_new_tokens;
  if (g.num_beams) p.num_beams = *g.num_beams;
  if (g.length_penalty) p.length_penalty = *g.length_penalty;
  if (g.early_stopping) {
    switch (*g.early_stopping) {
      case EarlyStoppingSetting::kHeuristic:
        p.early_stopping = EarlyStopping::kHeuristic;
        break;
      case EarlyStoppingSetting::kAlways:
        p.early_stopping = EarlyStopping::kAlways;
        break;
      case EarlyStoppingSetting::kNever:
        p.early_stopping = EarlyStopping::kNever;
        break;
    }
  }
  if (g.do_sample) p.do_sample = *g.do_sample;
  if (g.temperature) p.temperature = *g.temperature;
  if (g.top_k) p.top_k = *g.top_k;
  if (g.top_p) p.top_p = *g.top_p;
  if (g.repetition_penalty) p.repetition_penalty = static_cast<float>(*g.repetition_penalty);
  if (g.no_repeat_ngram_size) p.no_repeat_ngram_size = *g.no_repeat_ngram_size;
  if (g.encoder_no_repeat_ngram_size)
    p.encoder_no_repeat_ngram_size = *g.encoder_no_repeat_ngram_size;
  if (g.bad_words_ids) p.bad_words_ids = *g.bad_words_ids;
  if (g.suppress_tokens) p.suppress_tokens = *g.suppress_tokens;
  if (g.min_length) p.min_length = *g.min_length;
  if (g.forced_bos_token_id) p.forced_bos_token_id = *g.forced_bos_token_id;
  if (g.forced_eos_token_ids) p.forced_eos_token_ids = *g.forced_eos_token_ids;
  return p;
}

namespace {

// The whole number environment variable `name` holds (within [least, most]), or `fallback`
// where it is not set; a usage error naming the variable otherwise.
int64_t env_count(const char* name, const char* what, int64_t least, int64_t most,
                  int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  const std::string_view s(v);
  const bool digits = !s.empty() && s.size() <= 9 &&
                      std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int64_t n = digits ? std::atoll(v) : -1;
  KILN_CHECK_USAGE(n >= least && n <= most, "{}={}: give {} ({}..{})", name, v, what, least, most);
  return n;
}

KvGeometry geometry_of(CompiledModel& m, int block_size) {
  KvGeometry g;
  g.layers = m.desc().cache_layers;
  g.row_width = m.desc().cache_row_width();
  g.block_size = block_size;
  g.dtype = m.kv_cache_dtype();
  return g;
}

}  // namespace

Scheduler::Scheduler(CompiledModel& model, SchedulerOptions options)
    : model_(model),
      selector_(model.backend().token_selector()),
      options_(options),
      kv_(model.backend().create_kv_storage(geometry_of(model, options.kv_block_size))),
      blocks_(*kv_, options.kv_budget_blocks) {
  const ShapeProfile& profile = model_.model().profile;
  if (options_.max_step_tokens <= 0) options_.max_step_tokens = profile.max_step_tokens;
  KILN_CHECK_USAGE(options_.max_batch >= 1 && options_.max_batch <= profile.max_batch,
                   "batch size {} is outside 1..{} (the plan's profile)", options_.max_batch,
                   profile.max_batch);
  KILN_CHECK_USAGE(options_.max_step_tokens <= profile.max_step_tokens,
                   "{} tokens per step exceed the plan's {}", options_.max_step_tokens,
                   profile.max_step_tokens);
  // A decode step gives each running sequence one token.
  options_.max_step_tokens = std::max<int64_t>(options_.max_step_tokens, options_.max_batch);
  eos_ids_ = model_.desc().eos_token_ids;
  if (model_.desc().encoder_decoder && model_.backend().allocator().device() == Device::kCpu)
    cross_pool_ = std::make_unique<PoolAllocator>(model_.backend().allocator());
  // The environment's A/B settings of the run-ahead (documented with SchedulerOptions).
  options_.join_hold_steps = static_cast<int>(
      env_count("KILN_JOIN_HOLD_STEPS", "a number of steps", 0, 999, options_.join_hold_steps));
  options_.join_prompt_tokens = env_count("KILN_JOIN_PROMPT_TOKENS", "a number of tokens", 1,
                                          999999, options_.join_prompt_tokens);
  KILN_CHECK_USAGE(options_.join_prompt_tokens >= 1,
                   "join_prompt_tokens {}: a queued step takes at least one prompt token",
                   options_.join_prompt_tokens);
  options_.encode_ahead =
      env_count("KILN_ENCODE_AHEAD", "1 (on) or 0 (off)", 0, 1, options_.encode_ahead) == 1;
  options_.encode_gather_steps = static_cast<int>(env_count(
      "KILN_ENCODE_GATHER_STEPS", "a number of steps", 0, 999, options_.encode_gather_steps));
  options_.encode_pad_tokens = env_count("KILN_ENCODE_PAD_TOKENS", "a number of tokens", 0, 9999,
                                         options_.encode_pad_tokens);
  const char* env = std::getenv("KILN_RUN_AHEAD");
  run_ahead_ = options_.run_ahead == RunAhead::kOn ||
               (options_.run_ahead == RunAhead::kAuto && model_.backend().runs_ahead() &&
                !(env != nullptr && std::string_view(env) == "0"));
}

Scheduler::~Scheduler() {
  if (unread_) {
    // Nothing reads it any more: only the backend's wait and check of it.
    std::vector<int64_t> ids(unread_->requests.size());
    try {
      selector_.finish_argmax_rows(ids);
    } catch (const std::exception& e) {
      model_.context().log().warn("the last decoder step's check failed: {}", e.what());
    }
  }
  if (!unchecked_cross_.empty()) {
    try {
      model_.backend().wait();
    } catch (const std::exception& e) {
      model_.context().log().warn("the last encoder step's check failed: {}", e.what());
    }
  }
  for (auto& r : running_) release(*r);
}

int64_t Scheduler::cross_kv_bytes() const {
  int64_t total = 0;
  for (const auto& r : running_)
    if (r->cross)
      for (size_t l = 0; l < r->cross->keys.size(); ++l)
        total += static_cast<int64_t>(r->cross->keys[l].nbytes() + r->cross->values[l].nbytes());
  return total;
}

bool Scheduler::is_eos(int64_t token) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
}

bool Scheduler::idle() const {
  std::lock_guard<std::mutex> lock(inbox_mutex_);
  return inbox_.empty() && cancels_.empty() && waiting_.empty() && running_.empty() && !unread_;
}

size_t Scheduler::waiting() const {
  std::lock_guard<std::mutex> lock(inbox_mutex_);
  return inbox_.size() + waiting_.size();
}

bool Scheduler::is_waiting(RequestId id) const {
  auto matches = [id](const std::unique_ptr<Request>& r) { return r->id == id; };
  std::lock_guard<std::mutex> lock(inbox_mutex_);
  return std::any_of(inbox_.begin(), inbox_.end(), matches) ||
         std::any_of(waiting_.begin(), waiting_.end(), matches);
}

RequestId Scheduler::submit(std::vector<int64_t> prompt_ids, const GenerationParams& params) {
  const ModelDesc& d = model_.desc();
  validate(params, d.vocab_size);
  KILN_CHECK_USAGE(params.stop_strings.empty(),
                   "stop strings need the generated text: submit through GenerationExecutor");
  const int64_t limit = model_.model().profile.max_input_tokens;
  KILN_CHECK_USAGE(!prompt_ids.empty(), "empty prompt: nothing to generate from");
  KILN_CHECK_USAGE(static_cast<int64_t>(prompt_ids.size()) <= limit,
                   "prompt is {} tokens; this model allows at most {} (set at build time with "
                   "--max-input-tokens)",
                   prompt_ids.size(), limit);
  for (int64_t id : prompt_ids)
    KILN_CHECK_USAGE(id >= 0 && id < d.vocab_size, "prompt token id {} is outside [0, {})", id,
                     d.vocab_size);
  auto r = std::make_unique<Request>();
  r->params = params;
  r->max_new = params.max_new_tokens;
  if (r->max_new == 0) {
    // HF's max_length counts the prompt for decoder-only models and the start token for
    // encoder-decoder ones.
    const int64_t used = d.encoder_decoder ? 1 : static_cast<int64_t>(prompt_ids.size());
    r->max_new = params.max_length - used;
    KILN_CHECK_USAGE(r->max_new > 0,
                     "max_length {} leaves no room for new tokens after {} tokens; set "
                     "--max-new-tokens",
                     params.max_length, used);
  }
  r->prompt = std::move(prompt_ids);
  r->rng.seed(params.seed);
  Beam b;
  b.seq = d.encoder_decoder ? std::vector<int64_t>{d.decoder_start_token_id} : r->prompt;
  r->beams.push_back(std::move(b));
  std::lock_guard<std::mutex> lock(inbox_mutex_);
  r->id = next_id_++;
  const RequestId id = r->id;
  inbox_.push_back(std::move(r));
  return id;
}

void Scheduler::cancel(RequestId id) {
  std::lock_guard<std::mutex> lock(inbox_mutex_);
  cancels_.push_back(id);
}

void Scheduler::release(Request& r) {
  for (Beam& b : r.beams) b.kv.release(blocks_);
}

void Scheduler::finish(Request& r, GenerationResult result, std::vector<GenerationEvent>& events) {
  release(r);
  r.done = true;
  GenerationEvent e;
  e.id = r.id;
  e.finished = true;
  // Beam search streams nothing until the winner is known.
  if (r.params.num_beams > 1 && result.finish_reason != FinishReason::kCancelled)
    e.new_tokens = result.output_ids;
  e.result = std::move(result);
  events.push_back(std::move(e));
}

void Scheduler::fail(Request& r, const std::string& message, std::vector<GenerationEvent>& events) {
  release(r);
  r.done = true;
  GenerationEvent e;
  e.id = r.id;
  e.finished = true;
  e.error = message;
  events.push_back(std::move(e));
}

void Scheduler::drain_inbox(std::vector<GenerationEvent>& events) {
  std::vector<RequestId> cancels;
  {
    std::lock_guard<std::mutex> lock(inbox_mutex_);
    for (auto& r : inbox_) waiting_.push_back(std::move(r));
    inbox_.clear();
    cancels.swap(cancels_);
  }
  for (RequestId id : cancels) {
    auto matches = [id](const std::unique_ptr<Request>& r) { return r->id == id; };
    if (auto it = std::find_if(waiting_.begin(), waiting_.end(), matches); it != waiting_.end()) {
      finish(**it, GenerationResult{{}, FinishReason::kCancelled, 0.0f}, events);
      waiting_.erase(it);
    } else if (auto jt = std::find_if(running_.begin(), running_.end(), matches);
               jt != running_.end()) {
      GenerationResult res{(*jt)->generated_tokens(), FinishReason::kCancelled, 0.0f};
      finish(**jt, std::move(res), events);
      running_.erase(jt);
    }
  }
}

// Admits waiting requests in order while the batch and the KV budget have room for them.
void Scheduler::admit(std::vector<GenerationEvent>& events) {
  const int bs = blocks_.block_size();
  int running_seqs = 0;
  for (auto& r : running_)
    running_seqs += std::max<int>(static_cast<int>(r->beams.size()), r->params.num_beams);
  std::vector<Request*> joining;
  while (!waiting_.empty()) {
    Request& r = *waiting_.front();
    const int seqs = r.params.num_beams;
    if (running_seqs + seqs > options_.max_batch && !running_.empty()) break;
    int64_t need = 0;
    for (const Beam& b : r.beams) need += (b.pending() + bs) / bs;  // prompt + one new token
    if (blocks_.budget() > 0 && need > blocks_.budget()) {
      fail(r,
           fmt::format("the request needs {} KV blocks for its {} tokens; the KV budget is {} "
                       "blocks",
                       need, r.beams.front().seq.size(), blocks_.budget()),
           events);
      waiting_.pop_front();
      continue;
    }
    // Keep one block per running sequence for its next token.
    if (need + running_seqs > blocks_.available() && !running_.empty()) break;
    std::unique_ptr<Request> owned = std::move(waiting_.front());
    waiting_.pop_front();
    owned->admitted = admissions_++;
    running_seqs += seqs;
    if (model_.desc().encoder_decoder && !owned->cross) joining.push_back(owned.get());
    running_.push_back(std::move(owned));
  }
  if (!joining.empty()) encode(joining, events);
}

void Scheduler::preempt(Request& r) {
  release(r);
  r.preempted = true;
  for (Beam& b : r.beams) b.scheduled = 0;
  ++preemptions_;
  model_.context().log().info("kv budget exhausted: request {} preempted (will be recomputed)",
                              r.id);
}

// Makes room in the KV cache for the tokens scheduled for `r`, preempting younger requests when
// the budget is exhausted. False when `r` itself cannot fit (it has been failed).
bool Scheduler::reserve_blocks(Request& r, std::vector<GenerationEvent>& events) {
  for (;;) {
    int64_t need = 0;
    for (const Beam& b : r.beams) need += b.kv.blocks_needed(blocks_, b.scheduled);
    if (need <= blocks_.available()) return true;
    Request* victim = nullptr;
    for (auto& other : running_)
      if (other.get() != &r && !other->done && !other->preempted && other->admitted > r.admitted &&
          (victim == nullptr || other->admitted > victim->admitted))
        victim = other.get();
    if (victim == nullptr) {
      int64_t held = 0;
      for (const Beam& b : r.beams) held += static_cast<int64_t>(b.kv.blocks().size());
      if (blocks_.budget() > 0 && held + need > blocks_.budget()) {
        fail(r,
             fmt::format("the KV budget of {} blocks cannot hold this request ({} blocks "
                         "needed)",
                         blocks_.budget(), held + need),
             events);
        return false;
      }
      // Older requests hold the blocks: this one waits for them (recomputed when readmitted).
      preempt(r);
      return false;
    }
    preempt(*victim);
  }
}

void Scheduler::run_decoder(const std::vector<Request*>& batch, bool apply_copies,
                            bool leave_unread, bool behind_encoder) {
  const CompiledModel::DecoderIo& io = model_.decoder_io();
  // This step's copy-on-write copies were recorded while reserving blocks; a retry after a
  // failed batch must not make them again.
  std::vector<BlockCopy> copies;
  if (apply_copies) copies.swap(layout_.copies);
  layout_.clear();
  layout_.copies = std::move(copies);
  ids_.clear();
  rows_.clear();
  for (Request* r : batch)
    for (Beam& b : r->beams) {
      if (b.scheduled == 0) continue;
      const int64_t from = b.kv.length();
      layout_.add_sequence(b.scheduled, from, b.kv.blocks(), r->cross.get());
      ids_.insert(ids_.end(), b.seq.begin() + from, b.seq.begin() + from + b.scheduled);
      b.row = static_cast<int64_t>(rows_.size());
      rows_.push_back(static_cast<int64_t>(ids_.size()) - 1);
    }
  std::vector<Tensor> inputs(model_.model().graph(kDecoderGraph).inputs.size());
  inputs[io.input_ids] = Tensor::from_vector(ids_, {static_cast<int64_t>(ids_.size())});
  inputs[io.logit_rows] = Tensor::from_vector(rows_, {static_cast<int64_t>(rows_.size())});
  StepContext step{&layout_, kv_.get(), behind_encoder};
  const std::span<const Tensor> out = model_.decoder().execute(inputs, &step);
  decoder_logits_ = out[io.logits];
  process_logits(batch);
  // Greedy rows cross as token ids (argmax where the logits live, when the backend can); rows
  // that sample, search beams or mask EOS copy their own logits row.
  Tensor tokens;
  start_argmax(batch, &tokens);
  if (leave_unread && argmax_started_) {
    Unread u;
    for (Request* r : batch) {
      u.requests.push_back(r->id);
      // Plain greedy: one beam. Its kv commits this step's tokens after this returns.
      const Beam& b = r->beams.front();
      u.emits.push_back(b.scheduled == b.pending() ? 1 : 0);
    }
    u.tokens = std::move(tokens);
    unread_ = std::move(u);
    return;
  }
  read_decoder(batch);
}

ProcessorState Scheduler::processor_state(const Request& r, const Beam& b) const {
  ProcessorState s;
  s.sequence = b.seq;
  s.prompt = r.prompt;
  s.generated = b.generated;
  s.max_new = r.max_new;
  s.eos_ids = eos_ids_;
  s.beam_search = r.params.num_beams > 1;
  return s;
}

bool Scheduler::eos_banned_plainly(const Request& r, const Beam& b) const {
  return !r.params.processes_logits() && eos_banned(r.params, processor_state(r, b));
}

void Scheduler::process_logits(const std::vector<Request*>& batch) {
  edits_.clear();
  for (Request* r : batch) {
    if (!r->params.processes_logits()) continue;
    for (const Beam& b : r->beams) {
      // Only rows whose token is chosen this step (not a prompt's earlier chunks).
      if (b.row < 0 || b.scheduled != b.pending()) continue;
      RowEdit e;
      if (!make_row_edit(r->params, processor_state(*r, b), &e)) continue;
      e.row = b.row;
      edits_.push_back(std::move(e));
    }
  }
  if (!edits_.empty()) selector_.edit_logits_rows(decoder_logits_, edits_);
}

void Scheduler::start_argmax(const std::vector<Request*>& batch, Tensor* tokens) {
  // Rows still below min_new_tokens or min_length may not pick EOS: the device argmax skips it
  // there (rows with processors had it banned by their edit, before any forced token).
  ban_eos_.assign(rows_.size(), 0);
  for (Request* r : batch)
    for (const Beam& b : r->beams)
      if (b.row >= 0 && eos_banned_plainly(*r, b)) ban_eos_[b.row] = 1;
  argmax_started_ = selector_.start_argmax_rows(decoder_logits_, eos_ids_, ban_eos_, tokens);
}

void Scheduler::read_decoder(const std::vector<Request*>& batch) {
  const Tensor& logits = decoder_logits_;
  row_topk_.clear();
  row_argmax_.assign(rows_.size(), -1);
  Backend& backend = model_.backend();
  const bool on_device = argmax_started_;
  if (on_device) selector_.finish_argmax_rows(row_argmax_);
  // Sampling with top-k and beam search need only each row's best few tokens: the device picks
  // them (after the temperature, with the EOS ban) and they cross instead of the row.
  int k = 0;
  row_temperature_.assign(rows_.size(), 1.0f);
  for (Request* r : batch) {
    const int want = device_candidates(*r);
    if (want == 0) continue;
    k = std::max(k, want);
    for (const Beam& b : r->beams)
      if (b.row >= 0 && r->params.do_sample) row_temperature_[b.row] = r->params.temperature;
  }
  const bool topk =
      k > 0 && selector_.top_k_rows(logits, k, row_temperature_, eos_ids_, ban_eos_, &topk_);
  row_topk_.assign(rows_.size(), 0);
  const int64_t vocab = logits.dim(1);
  Allocator& memory = backend.allocator();
  for (Request* r : batch) {
    const bool plain_greedy = on_device && !r->params.do_sample && r->params.num_beams <= 1;
    const bool candidates = topk && device_candidates(*r) > 0;
    for (Beam& b : r->beams) {
      if (b.row < 0 || plain_greedy) continue;
      row_argmax_[b.row] = -1;
      if (candidates) {
        row_topk_[b.row] = 1;
        continue;
      }
      // The host buffer is sized only when a row needs it: [rows, vocab] floats are 64 MB for
      // 64 BLOOM rows, and their first touch cost a prefill of that batch 30 ms.
      if (logits_.size() < static_cast<size_t>(logits.numel()))
        logits_.resize(static_cast<size_t>(logits.numel()));
      memory.copy_to_host(logits.slice_rows(b.row, b.row + 1), logits_.data() + b.row * vocab);
    }
  }
}

// How many of a row's best tokens decide the request's next token (0: it needs the whole row).
int Scheduler::device_candidates(const Request& r) const {
  int k = 0;
  if (r.params.num_beams > 1)
    k = static_cast<int>(BeamSearch::candidates_per_row(r.params.num_beams, eos_ids_.size()));
  else if (r.params.do_sample)
    k = r.params.top_k;  // 0: no top-k, the whole row
  return k <= selector_.max_top_k() ? k : 0;
}

// Row `row`'s device candidates, cut where the row ran out of allowed ids.
static size_t candidate_count(const TopKRows& t, int64_t row) {
  size_t n = 0;
  while (n < static_cast<size_t>(t.k) && t.ids[static_cast<size_t>(row * t.k) + n] >= 0) ++n;
  return n;
}

std::vector<GenerationEvent> Scheduler::step() {
  std::vector<GenerationEvent> events;
  drain_inbox(events);
  // A step left unread: the one after it is queued first where nothing changes.
  if (unread_ && step_unread(events)) return events;
  admit(events);
  if (running_.empty()) {
    check_encoder({}, events);
    blocks_.shrink();  // idle: give the cache's memory back
    if (cross_pool_) cross_pool_->shrink();
    return events;
  }
  // Token budget: one token for every decoding sequence first, then prefill chunks in
  // admission order.
  int64_t budget = options_.max_step_tokens;
  for (auto& r : running_)
    for (Beam& b : r->beams) {
      b.scheduled = 0;
      b.row = -1;
      if (b.pending() == 1 && budget > 0) {
        b.scheduled = 1;
        --budget;
      }
    }
  for (auto& r : running_)
    for (Beam& b : r->beams)
      if (b.pending() > 1 && budget > 0) {
        b.scheduled = std::min(b.pending(), budget);
        budget -= b.scheduled;
      }
  layout_.copies.clear();
  std::vector<Request*> batch;
  for (auto& r : running_) {
    if (r->done || r->preempted) continue;
    bool any = false;
    for (const Beam& b : r->beams) any |= b.scheduled > 0;
    if (!any) continue;
    if (!reserve_blocks(*r, events)) continue;
    for (Beam& b : r->beams)
      if (b.scheduled > 0) b.kv.prepare_append(blocks_, b.scheduled, &layout_.copies);
    batch.push_back(r.get());
  }
  // Preempted requests go back to the front of the queue, oldest first; failed ones are gone.
  for (auto it = running_.rbegin(); it != running_.rend(); ++it)
    if ((*it)->preempted && !(*it)->done) {
      (*it)->preempted = false;
      (*it)->admitted = -1;
      waiting_.push_front(std::move(*it));
    }
  std::erase_if(running_, [](const std::unique_ptr<Request>& r) { return !r || r->done; });
  if (batch.empty()) return events;

  // Behind an unchecked encoder the step is read at once (its read makes the encoder's check,
  // and a failure is isolated below), unless encoders run ahead: then the step may be left
  // unread like a queued step that requests joined, its read checks the encoder too, and a
  // failure there fails the step's requests (step_unread).
  const bool behind_encoder = !unchecked_cross_.empty();
  try {
    run_decoder(batch, true, (!behind_encoder || options_.encode_ahead) && can_leave_unread(batch),
                behind_encoder);
    if (!unread_) unchecked_cross_.clear();
    for (Request* r : batch)
      for (Beam& b : r->beams) b.kv.commit(b.scheduled);
    // Left unread: the next step() queues the step after it, then reads it.
    if (!unread_)
      for (Request* r : batch) advance(*r, events);
  } catch (const std::exception& batch_error) {
    // Isolate: run each request alone; the ones that fail again get an error event.
    unread_.reset();
    // The failure may be an unchecked encoder's: its requests' cross K/V are not trusted and are
    // computed again, checked, before their step runs alone (requeued ones on admission).
    if (behind_encoder) distrust_unchecked(batch, batch_error.what(), events);
    for (Request* r : batch) {
      try {
        if (model_.desc().encoder_decoder && !r->cross) encode_batch({r}, true);
        run_decoder({r}, false, false);
        for (Beam& b : r->beams) b.kv.commit(b.scheduled);
        advance(*r, events);
      } catch (const std::exception& e) {
        fail(*r, fmt::format("decoder failed: {}", e.what()), events);
      }
    }
  }
  ++steps_;
  std::erase_if(running_, [](const std::unique_ptr<Request>& r) { return r->done; });
  return events;
}

void Scheduler::advance(Request& r, std::vector<GenerationEvent>& events) {
  // A sequence whose prompt is still being prefilled in chunks has no token to choose yet.
  for (const Beam& b : r.beams)
    if (b.pending() > 0 || b.scheduled == 0) return;
  if (r.params.num_beams > 1) {
    advance_beams(r, events);
    return;
  }
  Beam& b = r.beams[0];
  const int64_t vocab = model_.desc().vocab_size;
  const bool device_argmax =
      b.row < static_cast<int64_t>(row_argmax_.size()) && row_argmax_[b.row] >= 0;
  const bool device_topk = b.row < static_cast<int64_t>(row_topk_.size()) && row_topk_[b.row];
  int64_t token;
  if (r.params.do_sample && device_topk) {
    // The device skipped EOS where it is banned, as it did for the argmax below.
    const size_t at = static_cast<size_t>(b.row * topk_.k);
    const size_t n = candidate_count(topk_, b.row);
    token = sample_sorted(std::span<const float>(topk_.values.data() + at, n),
                          std::span<const int64_t>(topk_.ids.data() + at, n), r.params, r.rng);
  } else if (!r.params.do_sample && device_argmax) {
    token = row_argmax_[b.row];
  } else {
    // The row's logits are on the host (CPU backends, or copied out for this row).
    KILN_CHECK(static_cast<int64_t>(logits_.size()) >= (b.row + 1) * vocab,
               "request {}: no logits on the host for row {}", r.id, b.row);
    std::span<float> row(logits_.data() + b.row * vocab, static_cast<size_t>(vocab));
    if (eos_banned_plainly(r, b))
      for (int64_t eos : eos_ids_) row[eos] = -INFINITY;
    token = r.params.do_sample ? sample_token(row, r.params, r.rng) : argmax(row);
  }
  if (is_eos(token) && !r.params.ignore_eos) {
    finish(r, GenerationResult{r.generated_tokens(), FinishReason::kEos, 0.0f}, events);
    return;
  }
  b.seq.push_back(token);
  ++b.generated;
  GenerationEvent e;
  e.id = r.id;
  e.new_tokens = {token};
  events.push_back(std::move(e));
  if (b.generated >= r.max_new)
    finish(r, GenerationResult{r.generated_tokens(), FinishReason::kLength, 0.0f}, events);
}

// HF beam search (runtime/beam_search.h); surviving beams fork their parent's KV blocks.
void Scheduler::advance_beams(Request& r, std::vector<GenerationEvent>& events) {
  if (!r.beam_search) {
    GenerationParams p = r.params;
    p.max_new_tokens = r.max_new;
    r.beam_search.emplace(p, eos_ids_);
  }
  BeamSearch& search = *r.beam_search;
  const int64_t vocab = model_.desc().vocab_size;
  bool device_topk = true;
  for (const Beam& beam : r.beams)
    device_topk &= beam.row < static_cast<int64_t>(row_topk_.size()) && row_topk_[beam.row];
  if (device_topk) {
    // The device's best tokens per beam: log-probabilities are logits less the log-normaliser
    // (rows with processors are processed log-probabilities already); EOS below
    // min_new_tokens was skipped there.
    const bool processed = r.params.processes_logits();
    std::vector<std::vector<BeamSearch::TokenLogProb>> rows(r.beams.size());
    for (size_t bi = 0; bi < r.beams.size(); ++bi) {
      const int64_t row = r.beams[bi].row;
      const size_t at = static_cast<size_t>(row * topk_.k);
      const float norm = processed ? 0.0f : topk_.log_norm[row];
      for (size_t j = 0; j < candidate_count(topk_, row); ++j)
        rows[bi].push_back({topk_.ids[at + j], topk_.values[at + j] - norm});
    }
    continue_beams(r, search.step(std::span<const std::vector<BeamSearch::TokenLogProb>>(rows)),
                   events);
    return;
  }
  const size_t width = static_cast<size_t>(vocab);
  std::vector<float> log_probs(r.beams.size() * width), lp;
  for (size_t bi = 0; bi < r.beams.size(); ++bi) {
    const Beam& beam = r.beams[bi];
    const std::span<const float> row(logits_.data() + beam.row * vocab, width);
    if (r.params.processes_logits()) {
      // The backend's edit made the row processed log-probabilities (process_logits).
      std::copy(row.begin(), row.end(), log_probs.begin() + static_cast<ptrdiff_t>(bi * width));
      continue;
    }
    log_softmax(row, &lp);
    // HF applies logits processors after log_softmax in beam search: no renormalisation.
    if (eos_banned_plainly(r, beam))
      for (int64_t eos : eos_ids_) lp[eos] = -INFINITY;
    std::copy(lp.begin(), lp.end(), log_probs.begin() + static_cast<ptrdiff_t>(bi * width));
  }
  continue_beams(r, search.step(log_probs, vocab), events);
}

// The beams after a search step: the finished request, or the next running beams (each forks
// its parent's KV blocks).
void Scheduler::continue_beams(Request& r, const std::vector<BeamContinuation>& next,
                               std::vector<GenerationEvent>& events) {
  const BeamSearch& search = *r.beam_search;
  if (search.done()) {
    const BeamHypothesis& best = search.best();
    finish(r,
           GenerationResult{best.tokens, best.eos ? FinishReason::kEos : FinishReason::kLength,
                            best.score},
           events);
    return;
  }
  std::vector<Beam> beams;
  for (const BeamContinuation& c : next) {
    const Beam& parent = r.beams[static_cast<size_t>(c.parent)];
    Beam b;
    b.seq = parent.seq;
    b.seq.push_back(c.token);
    b.generated = parent.generated + 1;
    b.kv = parent.kv.fork(blocks_);
    beams.push_back(std::move(b));
  }
  release(r);
  r.beams = std::move(beams);
}

std::vector<GenerationResult> Scheduler::generate(const std::vector<std::vector<int64_t>>& prompts,
                                                  const GenerationParams& params) {
  std::map<RequestId, size_t> order;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationParams request = params;
    request.seed = derive_seed(params.seed, i);
    order[submit(prompts[i], request)] = i;
  }
  std::vector<GenerationResult> results(prompts.size());
  size_t received = 0;
  while (received < prompts.size()) {
    for (GenerationEvent& e : step()) {
      if (!e.finished) continue;
      auto it = order.find(e.id);
      if (it == order.end()) continue;
      KILN_CHECK(e.error.empty(), "prompt {}: {}", it->second + 1, e.error);
      results[it->second] = std::move(e.result);
      ++received;
    }
  }
  return results;
}

}  // namespace kiln
