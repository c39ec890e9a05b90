// Iteration-level generation: the runtime's batching policy. Requests are submitted at any time
// (from any thread) and join the running batch between steps; each step runs the encoder for
// newly admitted encoder-decoder requests, then one decoder pass over every running sequence
// (prefill chunks for new ones, one token for the others), and emits per-request events.
//
// Thread-safety: one engine thread owns a Scheduler and calls step(); submit() and cancel() may
// be called from any thread (they only queue work for the next step). Nothing else of the
// runtime is thread-safe; in particular ThreadPool::parallel_for is not reentrant, so kernels
// run only on the engine thread.
//
// Budgets: a step runs at most max_step_tokens tokens (longer prompts are prefilled in chunks)
// and max_batch sequences; a request is admitted only when the KV budget has blocks for its
// prompt. When a running sequence needs a block and the budget is exhausted, the most recently
// admitted other request is preempted: its blocks are freed, and it is recomputed (its tokens
// prefilled again) when it is readmitted. A request that cannot fit even alone fails with an
// error event; the others are unaffected.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/pool_allocator.h"
#include "kiln/generate.h"
#include "runtime/beam_search.h"
#include "runtime/compiled_model.h"
#include "runtime/kv_cache.h"
#include "runtime/logits_processors.h"

namespace kiln {

using RequestId = int64_t;

// Run-ahead: while every running request decodes greedily with one beam, a decode step is
// queued before the tokens of the step before it are read; those tokens feed it where the argmax
// left them (TokenSelector::start_argmax_rows, TokenSelector::gather_ids). On a backend whose
// execute() returns before the step has run (CUDA), the device then has the next step queued while
// the host reads tokens, emits events and plans: no gap between steps. The batch changes without a
// gap: requests that ended leave (their rows are dropped), greedy prompts that fit join with
// their whole prompt (with SchedulerOptions::encode_ahead, an encoder-decoder request's encoder
// queued just before the step it joins; otherwise it joins in a step planned after a read). A
// request that stops (EOS) while the next step is queued wastes that step's row. kAuto: on where
// the backend runs_ahead(), unless the environment sets KILN_RUN_AHEAD=0 (A/B runs); kOn: on any
// backend (tests of the schedule on the CPU, where it changes the order of the work, not its
// amount). While a step is unread its tokens live in the backend's argmax buffer and its results in
// the executor's workspace: one scheduler at a time steps a compiled model (as the workspaces
// already require).
enum class RunAhead { kAuto, kOn, kOff };

struct SchedulerOptions {
  int max_batch = 8;             // sequences (beams included) stepped together
  int64_t max_step_tokens = 0;   // 0: the plan's profile
  int64_t kv_budget_blocks = 0;  // 0: no limit
  int kv_block_size = 16;        // positions per KV block
  RunAhead run_ahead = RunAhead::kAuto;
  // Run-ahead: queued steps in a row that a waiting request may be held back, so that the
  // arrivals of those steps join one step together: a request that needs a planned step (an
  // encoder-decoder prompt without encode_ahead, sampling, beams), and encoder-decoder prompts
  // whose encoder step would be longer than the backend replays (Backend::replayed_step_tokens:
  // on CUDA a longer step is launched kernel by kernel, not replayed from a graph). Decoder
  // prompts are not held back: they join in chunks (join_prompt_tokens).
  // KILN_JOIN_HOLD_STEPS=N sets it (A/B runs); 0: every arrival joins the next step.
  int join_hold_steps = 4;
  // Run-ahead: the prompt tokens a queued step takes beside its decoding rows, the chunks of
  // prompts under way and of the prompts that join it together. A prompt longer than what is left
  // joins in chunks over the queued steps after it (its first token comes with its last chunk):
  // every stream in the batch waits for a step that prompts join, so this bounds how much longer
  // than a decode step such a step is. KILN_JOIN_PROMPT_TOKENS=N sets it (A/B runs).
  int64_t join_prompt_tokens = 64;
  // Run-ahead, encoder-decoder models: a greedy arrival joins a queued step, its encoder queued
  // on the device just before that step (its check is the queued step's read, and bad data an
  // encoder reports then fails that step's requests instead of being isolated to its own).
  // Off by default (KILN_ENCODE_AHEAD=1 turns it on for A/B runs): an arrival waits for a
  // planned step, which reads the step before it and isolates an encoder's failure.
  bool encode_ahead = false;
  // With encode_ahead: queued steps in a row that encoder-decoder arrivals wait, so that those
  // that arrive meanwhile share one encoder step (an encoder step of a few tokens costs about as
  // much as one of a few hundred: its time is the launches of its layers). 0: each joins the
  // next queued step. KILN_ENCODE_GATHER_STEPS=N sets it (A/B runs).
  int encode_gather_steps = 0;
  // On a backend that keeps state per step shape (Backend::replayed_step_tokens > 0: CUDA's
  // graphs, and each Linear's cuBLASLt algorithm chosen per row count by a host-side heuristic
  // query), encoder steps of any size are padded to a multiple of this many tokens (a sequence
  // of pad tokens whose outputs are dropped), so that they repeat a few shapes instead of one per
  // sum of prompt lengths. 0: no padding. KILN_ENCODE_PAD_TOKENS=N sets it (A/B).
  int64_t encode_pad_tokens = 0;
};

struct GenerationEvent {
  RequestId id = 0;
  std::vector<int64_t> new_tokens;  // ids that became final this step (beams: all at the end)
  bool finished = false;
  GenerationResult result;  // set when finished without error
  std::string error;        // non-empty: the request failed (finished is true)
};

// HF's defaults with the model's generation_config.json applied on top.
GenerationParams default_generation_params(const ModelDesc& desc);

class Scheduler {
 public:
  explicit Scheduler(CompiledModel& model, SchedulerOptions options = {});
  ~Scheduler();

  // Validates (usage errors throw here, naming the field) and queues a request for the next
  // step. Thread-safe.
  RequestId submit(std::vector<int64_t> prompt_ids, const GenerationParams& params);
  // The request ends before the next step: its blocks are freed and a finished event with
  // FinishReason::kCancelled is emitted. Unknown or finished ids are ignored. Thread-safe.
  void cancel(RequestId id);
  // One iteration (engine thread only). Returns this step's events.
  std::vector<GenerationEvent> step();
  bool idle() const;
  // Requests submitted and not yet admitted to the running batch (engine thread only).
  size_t waiting() const;
  bool is_waiting(RequestId id) const;
  // Whether this scheduler runs ahead (SchedulerOptions::run_ahead resolved).
  bool runs_ahead() const { return run_ahead_; }
  // Decode steps that were queued behind an unread one.
  int64_t steps_ahead() const { return steps_ahead_; }
  // Encoder steps run (encoder-decoder models), retries of a failed one included.
  int64_t encoder_steps() const { return encoder_steps_; }

  // Convenience: submits all, steps until done, results in prompt order; prompt i samples
  // from derive_seed(params.seed, i). A failed request throws naming its index.
  std::vector<GenerationResult> generate(const std::vector<std::vector<int64_t>>& prompts,
                                         const GenerationParams& params);

  int64_t kv_blocks_in_use() const { return blocks_.in_use(); }
  // Bytes of cross-attention K/V held by running requests (each holds only its own rows).
  int64_t cross_kv_bytes() const;
  // Bytes of logits the scheduler holds on the host: only rows that needed a whole row there
  // (sampling without top-k, backends without a device argmax) were copied.
  int64_t host_logits_bytes() const {
    return static_cast<int64_t>(logits_.capacity() * sizeof(float));
  }
  int64_t kv_bytes_allocated() const { return kv_->bytes_allocated(); }
  // The type the KV cache holds keys and values in (the backend's choice for the plan).
  DType kv_dtype() const { return kv_->geometry().dtype; }
  size_t running() const { return running_.size(); }
  int64_t steps() const { return steps_; }
  int64_t preemptions() const { return preemptions_; }

 private:
  struct Beam;
  struct Request;

  void drain_inbox(std::vector<GenerationEvent>& events);
  void admit(std::vector<GenerationEvent>& events);
  void encode(std::vector<Request*>& joining, std::vector<GenerationEvent>& events);
  // Runs the encoder over `batch` and gives each request its cross K/V. Unless `checked`, a
  // backend that runs ahead returns before the encoder is done and the batch joins
  // unchecked_cross_.
  void encode_batch(const std::vector<Request*>& batch, bool checked);
  // Makes the check of an encoder step left unchecked (unchecked_cross_) before other work
  // would make it and be blamed for its error; on an error, distrust_unchecked(redo).
  void check_encoder(const std::vector<Request*>& redo, std::vector<GenerationEvent>& events);
  // unchecked_cross_'s requests after their encoder's check failed: their cross K/V are not
  // trusted and are dropped. Waiting ones are encoded again on admission and those in `redo` by
  // the caller (one at a time, checked); any other running one fails with `error`.
  void distrust_unchecked(const std::vector<Request*>& redo, const std::string& error,
                          std::vector<GenerationEvent>& events);
  bool reserve_blocks(Request& r, std::vector<GenerationEvent>& events);
  void preempt(Request& r);
  // Queues a decoder step over the batch and starts its argmax; reads the results unless
  // leave_unread and the argmax stayed where the logits are (then unread_ is set).
  // behind_encoder: the step is queued behind an encoder step whose check is pending.
  void run_decoder(const std::vector<Request*>& batch, bool apply_copies, bool leave_unread,
                   bool behind_encoder = false);
  // Starts the argmax of decoder_logits_ (the rows of the batch's scheduled beams), with the
  // EOS bans of min_new_tokens; sets argmax_started_ and, when started, *tokens.
  void start_argmax(const std::vector<Request*>& batch, Tensor* tokens);
  // Applies the batch's logits processors (GenerationParams::processes_logits) to
  // decoder_logits_ where they live, before any token is chosen from them.
  void process_logits(const std::vector<Request*>& batch);
  ProcessorState processor_state(const Request& r, const Beam& b) const;
  // EOS is banned for b's next token and no processor edit bans it (the selection does).
  bool eos_banned_plainly(const Request& r, const Beam& b) const;
  // The last decoder step's token choices to the host (argmax, top-k, logits rows).
  void read_decoder(const std::vector<Request*>& batch);
  // Run-ahead (scheduler_run_ahead.cc). The step queued behind the unread one: the unread step's
  // requests that go on, each with its row in the unread step's ids, and waiting requests that
  // join with their whole prompt.
  // The unread step's requests whose prompt is not all in the cache go on with their next
  // chunk (`chunks`, with `joins`: a prompt's part this step takes, in the order of the step's
  // rows after the carried ones).
  struct AheadPlan {
    std::vector<std::pair<Request*, int64_t>> carry;
    std::vector<Request*> continues;  // running requests prefilling their prompt in chunks
    std::vector<Request*> joins;
    std::vector<int64_t> chunks;  // tokens each of continues, then each of joins, feeds
    bool holds_back = false;      // a waiting request that needs a planned step waits one more
  };
  int held_back_ = 0;  // queued steps in a row that held a waiting request back
  bool can_leave_unread(const std::vector<Request*>& batch) const;
  std::optional<AheadPlan> plan_ahead(const std::vector<Request*>& batch,
                                      const std::vector<uint8_t>& emits) const;
  bool step_unread(std::vector<GenerationEvent>& events);
  void launch_ahead(const AheadPlan& plan, const Tensor& tokens);
  void advance(Request& r, std::vector<GenerationEvent>& events);
  void advance_beams(Request& r, std::vector<GenerationEvent>& events);
  void continue_beams(Request& r, const std::vector<BeamContinuation>& next,
                      std::vector<GenerationEvent>& events);
  int device_candidates(const Request& r) const;
  void finish(Request& r, GenerationResult result, std::vector<GenerationEvent>& events);
  void fail(Request& r, const std::string& message, std::vector<GenerationEvent>& events);
  void release(Request& r);
  bool is_eos(int64_t token) const;

  CompiledModel& model_;
  // Token selection where the decoder's logits live (the backend's, Backend::token_selector).
  TokenSelector& selector_;
  SchedulerOptions options_;
  std::unique_ptr<KvStorage> kv_;
  BlockManager blocks_;
  // Host backends' T5 requests' cross K/V, at their exact sizes in chunks kept for the next
  // requests (given back when idle, with the KV cache's memory); null elsewhere.
  std::unique_ptr<PoolAllocator> cross_pool_;
  std::vector<int64_t> eos_ids_;

  mutable std::mutex inbox_mutex_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<RequestId> cancels_;
  RequestId next_id_ = 0;

  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;  // admission order
  int64_t admissions_ = 0;
  int64_t steps_ = 0;
  int64_t preemptions_ = 0;
  int64_t steps_ahead_ = 0;
  int64_t encoder_steps_ = 0;
  bool run_ahead_ = false;
  // A decode step whose tokens are not read yet: its requests in row order, and its argmax ids
  // where the logits were.
  struct Unread {
    std::vector<RequestId> requests;
    std::vector<uint8_t> emits;  // per request: its row is its next token (not a prompt chunk's)
    Tensor tokens;
  };
  std::optional<Unread> unread_;
  // Requests whose cross K/V come from an encoder step not checked yet: it was left for the
  // next decode step's read, so that this step is queued while the encoder still runs (the GPU
  // would otherwise wait for the host between the two). A read that fails makes them encode
  // again, checked.
  std::vector<RequestId> unchecked_cross_;

  // Reused every step.
  StepLayout layout_;
  std::vector<int64_t> ids_, rows_;
  // Each row's argmax computed by the backend where the logits live (-1: read logits_ instead).
  std::vector<int64_t> row_argmax_;
  std::vector<uint8_t> ban_eos_;  // per logits row: EOS may not be picked (min lengths)
  std::vector<RowEdit> edits_;    // this step's logits processors (process_logits)
  // Device backends: each row's best tokens for sampling and beam search (top_k_rows), valid in
  // the rows where row_topk_ is non-zero (else read logits_).
  TopKRows topk_;
  std::vector<uint8_t> row_topk_;
  std::vector<float> row_temperature_;
  std::vector<float> logits_;  // [rows, vocab] copied out of the decoder's workspace
  Tensor decoder_logits_;      // the last decoder step's output (in its workspace)
  bool argmax_started_ = false;
};

}  // namespace kiln
