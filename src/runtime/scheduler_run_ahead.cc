// The scheduler's run-ahead (SchedulerOptions::run_ahead): a decode step queued before the
// tokens of the step before it are read. The unread step's argmax ids stay where its logits
// were; the queued step takes the rows of the requests that go on (TokenSelector::gather_ids, in
// the device's order) and the prompts of requests that join; the host then reads the unread step's
// ids (waiting for that argmax only, not for the queued step), emits the events and returns
// while the device runs.
#include <algorithm>
#include <mutex>

#include "runtime/scheduler.h"
#include "runtime/scheduler_request.h"

namespace kiln {

namespace {

// A request whose next token is its row's argmax and nothing else: what a step left unread may
// hold (its read takes only the argmax ids).
bool plain_greedy(const GenerationParams& p, size_t beams) {
  return beams == 1 && p.num_beams <= 1 && !p.do_sample && !p.processes_logits();
}

}  // namespace

// A step over `batch` may be left unread (read by the next step(), after the step behind it is
// queued) when every request in it is plain greedy.
bool Scheduler::can_leave_unread(const std::vector<Request*>& batch) const {
  if (!run_ahead_ || batch.empty()) return false;
  for (const Request* r : batch)
    if (r == nullptr || r->done || r->preempted || !plain_greedy(r->params, r->beams.size()))
      return false;
  return true;
}

// The step to queue behind the unread one over `batch` (its requests in row order; null where
// one has left; `emits`: whose row is a token), or none when the next step must be planned after
// the read:
// - a request of the unread step goes on when its whole prompt is in the cache (the unread
//   step's token is its next input) and that token is not its last (at the length limit it
//   ends when read; a request that stops at EOS keeps a row nobody reads); one whose row was a
//   prompt chunk's goes on with its next chunk;
// - every running request is in the unread step (one left out waits for a planned step);
// - beside its decoding rows the step takes at most SchedulerOptions::join_prompt_tokens prompt
//   tokens (and max_step_tokens in all): the chunks of prompts under way, then waiting requests
//   join in order while they are plain
//   greedy and the batch and the KV cache have room, each with as much of its prompt as is
//   left of the step (the rest in the steps after). One that needs a planned step (not plain
//   greedy, or encoder-decoder without SchedulerOptions::encode_ahead), with room in the batch,
//   stops the run-ahead after SchedulerOptions::join_hold_steps queued steps (the arrivals of
//   those steps join the same planned step; it admits them, or refuses one with the reason);
//   encoder-decoder prompts that would make the encoder step queued before the step longer than
//   the backend replays are held back as long, then join together;
// - the KV cache has a block for every new position.
std::optional<Scheduler::AheadPlan> Scheduler::plan_ahead(const std::vector<Request*>& batch,
                                                          const std::vector<uint8_t>& emits) const {
  if (!run_ahead_ || batch.empty()) return std::nullopt;
  AheadPlan plan;
  int64_t stepped = 0;  // live requests of the unread step (each one of running_)
  int64_t blocks = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Request* r = batch[i];
    if (r == nullptr || r->done) continue;
    if (r->preempted || !plain_greedy(r->params, r->beams.size())) return std::nullopt;
    const Beam& b = r->beams.front();
    if (b.row < 0) return std::nullopt;
    ++stepped;
    if (!emits[i]) {
      if (b.pending() <= 0) return std::nullopt;
      plan.continues.push_back(r);
      continue;
    }
    if (b.pending() > 0) return std::nullopt;
    if (b.generated + 1 >= r->max_new) continue;
    plan.carry.emplace_back(r, b.row);
    blocks += b.kv.blocks_needed(blocks_, 1);
  }
  if (std::count_if(running_.begin(), running_.end(),
                    [](const std::unique_ptr<Request>& r) { return !r->done; }) != stepped)
    return std::nullopt;
  int64_t seqs = static_cast<int64_t>(plan.carry.size());
  const int64_t limit = std::min(seqs + options_.join_prompt_tokens, options_.max_step_tokens);
  int64_t tokens = seqs;
  // The prompts under way come first: each goes on in this step or the run-ahead stops.
  for (Request* r : plan.continues) {
    const Beam& b = r->beams.front();
    const int64_t chunk = std::min(b.pending(), limit - tokens);
    if (chunk <= 0) return std::nullopt;
    plan.chunks.push_back(chunk);
    blocks += b.kv.blocks_needed(blocks_, chunk);
    tokens += chunk;
    ++seqs;
  }
  const int64_t replayed = model_.backend().replayed_step_tokens();
  int64_t encoded = 0;  // prompt tokens of the encoder step queued first (encoder-decoder)
  const bool enc_dec = model_.desc().encoder_decoder;
  for (const auto& w : waiting_) {
    Request& r = *w;
    if (seqs + r.params.num_beams > options_.max_batch) break;  // it waits for room either way
    if (tokens >= limit) break;                                 // it joins a step after this one
    const Beam& b = r.beams.front();
    // Admission keeps blocks for the whole prompt, as admit() does; this step takes its chunk's.
    const int64_t need = b.kv.blocks_needed(blocks_, b.pending());
    const int64_t chunk = std::min(b.pending(), limit - tokens);
    const int64_t encode = enc_dec && !r.cross ? static_cast<int64_t>(r.prompt.size()) : 0;
    if ((enc_dec && !options_.encode_ahead) || !plain_greedy(r.params, r.beams.size()) ||
        encoded + encode > options_.max_step_tokens ||
        (blocks_.budget() > 0 && need > blocks_.budget())) {
      // It needs a planned step: a few steps more gather the requests that arrive meanwhile
      // into it (one gap for several arrivals), then it comes.
      if (held_back_ >= options_.join_hold_steps) return std::nullopt;
      plan.holds_back = true;
      break;
    }
    // Arrivals gather for one encoder step (encode_gather_steps); an encoder step too long for
    // the backend's replayed steps waits for others to join with it.
    if (encode > 0 && held_back_ < options_.encode_gather_steps) {
      plan.holds_back = true;
      break;
    }
    if (replayed > 0 && encoded + encode > replayed && held_back_ < options_.join_hold_steps) {
      plan.holds_back = true;
      break;
    }
    // One block per sequence kept for its next token, as admit() keeps.
    if (blocks + need + seqs > blocks_.available()) break;
    plan.joins.push_back(w.get());
    plan.chunks.push_back(chunk);
    blocks += b.kv.blocks_needed(blocks_, chunk);
    tokens += chunk;
    encoded += encode;
    ++seqs;
  }
  {
    // A cancel that arrived during the step is taken by a planned step, not raced with here.
    std::lock_guard<std::mutex> lock(inbox_mutex_);
    if (!cancels_.empty()) return std::nullopt;
  }
  if (plan.carry.empty() && plan.continues.empty() && plan.joins.empty()) return std::nullopt;
  if (blocks > blocks_.available()) return std::nullopt;
  return plan;
}

// Queues the step `plan` describes behind the unread one, whose ids are `tokens`: each carried
// request appends one position (its KV length counts it from now on), each joining one its
// whole prompt and moves to the running batch. Its logits: decoder_logits_.
void Scheduler::launch_ahead(const AheadPlan& plan, const Tensor& tokens) {
  const CompiledModel::DecoderIo& io = model_.decoder_io();
  layout_.clear();
  rows_.clear();
  std::vector<int64_t> keep, tail;
  for (const auto& [r, row] : plan.carry) {
    Beam& b = r->beams.front();
    b.kv.prepare_append(blocks_, 1, &layout_.copies);
    layout_.add_sequence(1, b.kv.length(), b.kv.blocks(), r->cross.get());
    keep.push_back(row);
    rows_.push_back(static_cast<int64_t>(keep.size()) - 1);
  }
  // Encoder-decoder arrivals: their encoder step first, on the device's queue behind the unread
  // step (unchecked: the queued step's read checks it).
  if (model_.desc().encoder_decoder) {
    std::vector<Request*> encode;
    for (Request* r : plan.joins)
      if (!r->cross) encode.push_back(r);
    if (!encode.empty()) encode_batch(encode, false);
  }
  // The prompts under way, then the joining ones: their chunks from the host.
  std::vector<Request*> chunked(plan.continues);
  chunked.insert(chunked.end(), plan.joins.begin(), plan.joins.end());
  for (size_t i = 0; i < chunked.size(); ++i) {
    Beam& b = chunked[i]->beams.front();
    const int64_t n = plan.chunks[i];
    b.kv.prepare_append(blocks_, n, &layout_.copies);
    layout_.add_sequence(n, b.kv.length(), b.kv.blocks(), chunked[i]->cross.get());
    tail.insert(tail.end(), b.seq.begin() + b.kv.length(), b.seq.begin() + b.kv.length() + n);
    rows_.push_back(static_cast<int64_t>(keep.size() + tail.size()) - 1);
  }
  bool all_rows = tail.empty() && static_cast<int64_t>(keep.size()) == tokens.dim(0);
  for (size_t i = 0; all_rows && i < keep.size(); ++i)
    all_rows = keep[i] == static_cast<int64_t>(i);
  std::vector<Tensor> inputs(model_.model().graph(kDecoderGraph).inputs.size());
  inputs[io.input_ids] = all_rows ? tokens : selector_.gather_ids(tokens, keep, tail);
  inputs[io.logit_rows] = Tensor::from_vector(rows_, {static_cast<int64_t>(rows_.size())});
  StepContext step{&layout_, kv_.get(), /*behind_unread=*/true};
  std::span<const Tensor> out;
  try {
    out = model_.decoder().execute(inputs, &step);
  } catch (...) {
    // The joining requests stay in the queue, their prepared blocks given back.
    for (Request* r : plan.joins) release(*r);
    throw;
  }
  // The carried requests' rows (0, 1, ... in order) are set after the unread step's read, which
  // uses the rows they had (step_unread); the chunked ones follow them.
  int64_t row = static_cast<int64_t>(plan.carry.size());
  for (const auto& [r, unread_row] : plan.carry) r->beams.front().kv.commit(1);
  for (size_t i = 0; i < chunked.size(); ++i) {
    Beam& b = chunked[i]->beams.front();
    b.scheduled = plan.chunks[i];
    b.kv.commit(b.scheduled);
    b.row = row++;
  }
  for (Request* r : plan.joins) {
    auto it = std::find_if(waiting_.begin(), waiting_.end(),
                           [r](const std::unique_ptr<Request>& w) { return w.get() == r; });
    std::unique_ptr<Request> owned = std::move(*it);
    waiting_.erase(it);
    owned->admitted = admissions_++;
    running_.push_back(std::move(owned));
  }
  decoder_logits_ = out[io.logits];
}

// Reads the unread step: first queues the step after it where plan_ahead allows. True when that
// step was queued (it is now the unread one and this call's work is done).
bool Scheduler::step_unread(std::vector<GenerationEvent>& events) {
  Unread unread = std::move(*unread_);
  unread_.reset();
  std::vector<Request*> batch;
  for (RequestId id : unread.requests) {
    auto it = std::find_if(running_.begin(), running_.end(),
                           [id](const std::unique_ptr<Request>& r) { return r->id == id; });
    batch.push_back(it != running_.end() ? it->get() : nullptr);
  }
  std::optional<AheadPlan> plan = plan_ahead(batch, unread.emits);
  if (plan) {
    try {
      launch_ahead(*plan, unread.tokens);
    } catch (const std::exception& e) {
      // Nothing was committed: the next call plans this step again from the host's tokens
      // (and isolates a request that makes it fail).
      model_.context().log().warn("run-ahead step not queued: {}", e.what());
      plan.reset();
    }
  }
  row_argmax_.assign(unread.requests.size(), -1);  // one row a request (plain greedy)
  row_topk_.assign(unread.requests.size(), 0);
  // The read checks what the device ran before the unread step's argmax: the encoders of the
  // requests that joined it among them.
  auto checked = [&](const std::vector<Request*>& requests) {
    std::erase_if(unchecked_cross_, [&](RequestId id) {
      return std::any_of(requests.begin(), requests.end(),
                         [id](const Request* r) { return r != nullptr && r->id == id; });
    });
  };
  try {
    selector_.finish_argmax_rows(row_argmax_);
    checked(batch);
  } catch (const std::exception& e) {
    checked(batch);
    if (plan) checked(plan->joins);
    // The device found bad data in the unread step (or one before it). Its requests fail, and
    // those that joined the step queued behind it (it ran on their tokens).
    for (Request* r : batch)
      if (r != nullptr && !r->done) fail(*r, fmt::format("decoder failed: {}", e.what()), events);
    if (plan)
      for (Request* r : plan->joins)
        if (!r->done) fail(*r, fmt::format("decoder failed: {}", e.what()), events);
    std::erase_if(running_, [](const std::unique_ptr<Request>& r) { return r->done; });
    return true;
  }
  // A row that was a prompt chunk's has no token (the prompt's next chunk may be queued
  // already, its row set).
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i] != nullptr && !batch[i]->done && unread.emits[i]) advance(*batch[i], events);
  if (plan) {
    // The carried requests take their rows in the queued step now that the read is done.
    for (size_t k = 0; k < plan->carry.size(); ++k) {
      Beam& b = plan->carry[k].first->beams.front();
      b.row = static_cast<int64_t>(k);  // launch_ahead's rows: the carried first, in order
      b.scheduled = 1;
    }
    // The queued step's argmax, after this step's tokens were counted (min_new_tokens bans; a
    // request that stopped here keeps a row whose token nobody reads).
    std::vector<Request*> queued;
    for (const auto& [r, row] : plan->carry) queued.push_back(r);
    queued.insert(queued.end(), plan->continues.begin(), plan->continues.end());
    queued.insert(queued.end(), plan->joins.begin(), plan->joins.end());
    Tensor tokens;
    start_argmax(queued, &tokens);
    KILN_CHECK(argmax_started_,
               "the backend took the argmax of one decode step and not of the next");
    Unread next;
    for (const Request* r : queued) {
      next.requests.push_back(r->id);
      next.emits.push_back(r->beams.front().pending() == 0 ? 1 : 0);  // its prompt all fed
    }
    next.tokens = std::move(tokens);
    unread_ = std::move(next);
    ++steps_;
    ++steps_ahead_;
    held_back_ = plan->holds_back ? held_back_ + 1 : 0;
  } else {
    held_back_ = 0;
  }
  std::erase_if(running_, [](const std::unique_ptr<Request>& r) { return r->done; });
  return plan.has_value();
}

}  // namespace kiln
