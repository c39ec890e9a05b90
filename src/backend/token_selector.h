// Token selection where a step's logits live: the greedy argmax (whole, or started and finished
// around the next step for the scheduler's run-ahead), the k best ids of each row for sampling
// and beam search, the edits of HuggingFace's logits processors, and the next step's ids
// gathered from this one's. The runtime uses it beside the backend that ran the step
// (Backend::token_selector). This class's own methods work on host logits: the reference
// backend's selection, and what a device selector falls back to for host tensors.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// What TokenSelector::top_k_rows returns: row-major [rows, k] ids and values (id -1 and value
// -inf past the end of a row with fewer than k allowed ids), and one log-normaliser per row.
struct TopKRows {
  int k = 0;
  std::vector<int64_t> ids;
  std::vector<float> values;
  std::vector<float> log_norm;
};

// HuggingFace's logits processors as edits of one row of logits, applied in this order:
// 1. log_softmax: the row becomes its log-softmax (beam search processes log-probabilities);
// 2. every id of `penalized` (no repeats): x < 0 ? x * penalty : x / penalty;
// 3. every id of `banned`: -inf;
// 4. `forced` not empty: every id -inf, then each forced id 0;
// 5. every id of `suppressed`: -inf.
struct RowEdit {
  int64_t row = 0;
  bool log_softmax = false;
  float penalty = 1.0f;
  std::vector<int64_t> penalized;
  std::vector<int64_t> banned;
  std::vector<int64_t> forced;
  std::vector<int64_t> suppressed;
};

// Throws naming the first edit whose row or id is outside `logits` [rows, vocab] (f32).
void check_row_edits(const Tensor& logits, std::span<const RowEdit> edits);
// One row's edits on the host (the reference for every backend's kernel).
void edit_logits_row(std::span<float> row, const RowEdit& edit);

class TokenSelector {
 public:
  virtual ~TokenSelector() = default;
  // Greedy decoding without copying logits: out[r] = the first index of the largest value of
  // row r of `logits` [rows, vocab] (f32), computed where the logits live, never one of
  // `banned` in the rows where banned_rows[r] is non-zero (EOS before min_new_tokens; empty:
  // no bans). False when there is no such kernel or it cannot ban that many ids (the caller
  // reads the logits on the host). Default: false.
  virtual bool argmax_rows(const Tensor& logits, std::span<int64_t> out,
                           std::span<const int64_t> banned = {},
                           std::span<const uint8_t> banned_rows = {}) {
    return false;
  }
  // argmax_rows in two halves, for a caller that queues the next decoder step before it reads
  // this one's tokens (the scheduler's run-ahead): start_argmax_rows starts the same argmax and
  // returns its ids where the logits live ([rows] int64, valid until the next start; they may be
  // the next step's input_ids), or false (*ids untouched) where argmax_rows would be false;
  // finish_argmax_rows waits for them and copies them to `out` (the started rows), reporting
  // errors of the steps before them as argmax_rows does. A step executed in between does not
  // delay finish_argmax_rows on a backend that runs_ahead(). Default: argmax_rows at the start,
  // its ids on the host.
  virtual bool start_argmax_rows(const Tensor& logits, std::span<const int64_t> banned,
                                 std::span<const uint8_t> banned_rows, Tensor* ids);
  virtual void finish_argmax_rows(std::span<int64_t> out);
  // The token ids of a step queued behind an unread one (the scheduler's run-ahead): rows `keep`
  // of that step's ids (start_argmax_rows' tensor, where it lives) and then `tail` (host ids:
  // prompts joining the batch), as one [keep + tail] i64 tensor for the next execute(), made in
  // the device's order without waiting for it. Default: on the host (ids in host memory).
  virtual Tensor gather_ids(const Tensor& ids, std::span<const int64_t> keep,
                            std::span<const int64_t> tail);
  // Sampling and beam search without copying logits: for every row r of `logits` [rows, vocab]
  // (f32), the k best ids by logits[r][id] / temperature[r] (temperature empty: 1), best first
  // with ties to the lower id, never one of `banned` where banned_rows[r] is non-zero, and the
  // row's log-normaliser log(sum_id exp(logits[r][id])) over every id, unscaled. False when
  // there is no such kernel or k or the bans are beyond it (the caller reads the logits).
  // The largest k top_k_rows takes (0: none, the default).
  virtual int max_top_k() const { return 0; }
  virtual bool top_k_rows(const Tensor& logits, int k, std::span<const float> temperature,
                          std::span<const int64_t> banned, std::span<const uint8_t> banned_rows,
                          TopKRows* out) {
    return false;
  }
  // Applies `edits` to rows of `logits` [rows, vocab] (f32) in place, where they live, before
  // argmax_rows / top_k_rows / a copy reads them. Every id must be inside the vocabulary and
  // every row inside `logits`. Default: on the host (logits in host memory).
  virtual void edit_logits_rows(Tensor& logits, std::span<const RowEdit> edits);

 private:
  std::vector<int64_t> started_ids_;  // the default start_argmax_rows's result
};

}  // namespace kiln
