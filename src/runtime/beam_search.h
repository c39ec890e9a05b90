// HuggingFace beam search bookkeeping for one request (transformers' `_beam_search`): which beams
// run next, which hypotheses are finished, and when to stop, over plain rows of log-probabilities.
// It knows nothing of KV caches or engines: step() says which (parent beam, token) continuations
// run next, and the caller forks its per-beam state by parent index.
//
// Per step, with g tokens generated so far (all running beams have the same length):
//  - candidates are the top K = max(2, 1 + number of EOS ids) * num_beams (beam, token) pairs by
//    running sum of log-probabilities; K is chosen so that at least num_beams of them do not end;
//  - a candidate ends when its token is an EOS id or g + 1 == max_new_tokens; an ending candidate
//    among the top num_beams becomes a finished hypothesis scored
//    sum / (g + 1)^length_penalty (the length counts the EOS token); the best num_beams finished
//    hypotheses are kept; ending candidates ranked lower are dropped;
//  - the best num_beams candidates that do not end are the next running beams;
//  - the request stops at max_new_tokens; with kAlways once num_beams hypotheses are finished;
//    and in every mode (HF's _check_early_stop_heuristic) once num_beams are finished and the best
//    running sum / L^length_penalty is not above the worst kept score, where L = max_new_tokens
//    for kNever with length_penalty > 0, else L = g + 1 (the running beams' current length).
// HF starts from num_beams copies of the prompt, all but one scored -1e9; starting from the one
// beam is the same whenever the vocabulary has at least K tokens.
// Ties keep a fixed order: within a row, lower token ids first; across beams, earlier beams first;
// among finished hypotheses, older ones first.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kiln/generate.h"

namespace kiln {

// A next running beam: the current running beam `parent` extended by `token`.
struct BeamContinuation {
  int parent;
  int64_t token;
};

struct BeamHypothesis {
  std::vector<int64_t> tokens;  // generated ids, EOS not included
  float score;                  // sum of log-probabilities / generated_len^length_penalty
  bool eos;                     // ended with an EOS id (else at max_new_tokens)
};

class BeamSearch {
 public:
  // Uses num_beams, max_new_tokens, length_penalty and early_stopping of `params`.
  BeamSearch(const GenerationParams& params, std::vector<int64_t> eos_ids);

  // The running beams, best first, in the order step() takes their rows. Before the first step
  // there is one, the empty prefix.
  int num_running() const { return static_cast<int>(running_.size()); }
  const std::vector<int64_t>& running_tokens(int beam) const;
  float running_score(int beam) const;  // sum of log-probabilities
  int64_t generated_len() const { return generated_; }

  // log_probs: [num_running(), vocab] row-major, each row an fp32 log_softmax of that running
  // beam's next-token logits. Returns the next running beams, best first, as continuations of the
  // current ones; empty once done().
  std::vector<BeamContinuation> step(std::span<const float> log_probs, int64_t vocab);
  // How many of each row's best tokens step() looks at (the K above), for a search with these
  // parameters (a scheduler asks before any search exists).
  static size_t candidates_per_row(int num_beams, size_t num_eos_ids);
  size_t candidates_per_row() const { return candidates_per_row(num_beams_, eos_ids_.size()); }
  // The same step from each running beam's best tokens only: rows[b] holds at least
  // min(candidates_per_row(), vocab) (token, log-probability) pairs of running beam b, best first,
  // ties to the lower id (what a TokenSelector's top_k_rows returns, less the row's
  // log-normaliser).
  struct TokenLogProb {
    int64_t token;
    float log_prob;
  };
  std::vector<BeamContinuation> step(std::span<const std::vector<TokenLogProb>> rows);

  bool done() const { return done_; }
  // The best finished hypothesis; only once done().
  const BeamHypothesis& best() const;
  // Finished hypotheses so far, best first, at most num_beams.
  const std::vector<BeamHypothesis>& finished() const { return finished_; }

 private:
  struct Running {
    std::vector<int64_t> tokens;
    float score;  // sum of log-probabilities
  };
  bool is_eos(int64_t token) const;
  float length_norm(int64_t length) const;
  bool no_improvement_possible() const;

  int num_beams_;
  int64_t max_new_tokens_;
  double length_penalty_;
  EarlyStopping early_stopping_;
  std::vector<int64_t> eos_ids_;
  std::vector<Running> running_;
  std::vector<BeamHypothesis> finished_;
  int64_t generated_ = 0;
  bool done_ = false;
};

}  // namespace kiln
