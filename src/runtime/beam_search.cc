#include "runtime/beam_search.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "core/status.h"

namespace kiln {

BeamSearch::BeamSearch(const GenerationParams& params, std::vector<int64_t> eos_ids)
    : num_beams_(params.num_beams),
      max_new_tokens_(params.max_new_tokens),
      length_penalty_(params.length_penalty),
      early_stopping_(params.early_stopping),
      eos_ids_(std::move(eos_ids)) {
  KILN_CHECK(num_beams_ >= 1, "beam search needs at least one beam, got {}", num_beams_);
  KILN_CHECK(max_new_tokens_ >= 1, "beam search needs max_new_tokens >= 1, got {}",
             max_new_tokens_);
  running_.push_back(Running{{}, 0.0f});
}

const std::vector<int64_t>& BeamSearch::running_tokens(int beam) const {
  KILN_CHECK(beam >= 0 && beam < num_running(), "running beam {} is outside [0, {})", beam,
             num_running());
  return running_[static_cast<size_t>(beam)].tokens;
}

float BeamSearch::running_score(int beam) const {
  KILN_CHECK(beam >= 0 && beam < num_running(), "running beam {} is outside [0, {})", beam,
             num_running());
  return running_[static_cast<size_t>(beam)].score;
}

bool BeamSearch::is_eos(int64_t token) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
}

// HF divides an fp32 score by the Python float length**length_penalty, which torch rounds to
// fp32 first.
float BeamSearch::length_norm(int64_t length) const {
  return static_cast<float>(std::pow(static_cast<double>(length), length_penalty_));
}

// HF's _check_early_stop_heuristic, evaluated after the step (generated_ already counts the new
// token). An unfilled hypothesis slot scores -1e9 there, which any live beam beats, so nothing
// stops before num_beams hypotheses exist.
bool BeamSearch::no_improvement_possible() const {
  if (static_cast<int>(finished_.size()) < num_beams_) return false;
  int64_t best_length = generated_;
  switch (early_stopping_) {
    case EarlyStopping::kNever:
      // A positive penalty favours length, so the longest allowed length bounds the score.
      if (length_penalty_ > 0.0) best_length = max_new_tokens_;
      break;
    case EarlyStopping::kHeuristic:
    case EarlyStopping::kAlways:
      break;
  }
  const float best_possible = running_.front().score / length_norm(best_length);
  return !(best_possible > finished_.back().score);
}

size_t BeamSearch::candidates_per_row(int num_beams, size_t num_eos_ids) {
  // Enough candidates that num_beams of them survive even when every running beam's best
  // tokens are all EOS ids.
  return std::max<size_t>(2, 1 + num_eos_ids) * static_cast<size_t>(num_beams);
}

std::vector<BeamContinuation> BeamSearch::step(std::span<const float> log_probs, int64_t vocab) {
  KILN_CHECK(!done_, "beam search: step() after the search finished");
  KILN_CHECK(vocab > 0 && log_probs.size() == running_.size() * static_cast<size_t>(vocab),
             "beam search: expected {} rows of {} log-probabilities, got {} values",
             running_.size(), vocab, log_probs.size());
  const size_t keep = candidates_per_row();
  std::vector<std::vector<TokenLogProb>> rows(running_.size());
  std::vector<int64_t> idx(static_cast<size_t>(vocab));
  for (size_t bi = 0; bi < running_.size(); ++bi) {
    const std::span<const float> row =
        log_probs.subspan(bi * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
    // Only this beam's best `keep` tokens can make the overall top `keep`.
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = std::min(keep, idx.size());
    std::partial_sort(
        idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
        [&](int64_t a, int64_t b) {
          return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)] ||
                 (row[static_cast<size_t>(a)] == row[static_cast<size_t>(b)] && a < b);
        });
    for (size_t j = 0; j < k; ++j) rows[bi].push_back({idx[j], row[static_cast<size_t>(idx[j])]});
  }
  return step(std::span<const std::vector<TokenLogProb>>(rows));
}

std::vector<BeamContinuation> BeamSearch::step(std::span<const std::vector<TokenLogProb>> rows) {
  KILN_CHECK(!done_, "beam search: step() after the search finished");
  KILN_CHECK(rows.size() == running_.size(), "beam search: {} candidate rows for {} beams",
             rows.size(), running_.size());
  const size_t nb = static_cast<size_t>(num_beams_);
  const size_t keep = candidates_per_row();
  struct Candidate {
    float score;  // running sum of log-probabilities including this token
    int beam;
    int64_t token;
  };
  std::vector<Candidate> cands;
  for (size_t bi = 0; bi < running_.size(); ++bi) {
    const size_t k = std::min(keep, rows[bi].size());
    for (size_t j = 0; j < k; ++j)
      cands.push_back(
          {running_[bi].score + rows[bi][j].log_prob, static_cast<int>(bi), rows[bi][j].token});
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
  if (cands.size() > keep) cands.resize(keep);

  const int64_t new_len = generated_ + 1;
  const bool at_max = new_len >= max_new_tokens_;
  const float norm = length_norm(new_len);
  // HF also refuses new hypotheses once early_stopping=True has num_beams of them, and once its
  // heuristic says no improvement is possible; both end the search at the step that reaches
  // them, so neither can happen here.
  std::vector<Running> next;
  std::vector<BeamContinuation> continuations;
  for (size_t rank = 0; rank < cands.size(); ++rank) {
    const Candidate& c = cands[rank];
    const Running& parent = running_[static_cast<size_t>(c.beam)];
    const bool eos = is_eos(c.token);
    if (eos || at_max) {
      // Lower-ranked ending candidates only exist to keep num_beams beams running.
      if (rank < nb) {
        BeamHypothesis h{parent.tokens, c.score / norm, eos};
        if (!eos) h.tokens.push_back(c.token);
        finished_.push_back(std::move(h));
      }
      continue;
    }
    if (next.size() >= nb) continue;
    Running r{parent.tokens, c.score};
    r.tokens.push_back(c.token);
    next.push_back(std::move(r));
    continuations.push_back({c.beam, c.token});
  }
  std::stable_sort(
      finished_.begin(), finished_.end(),
      [](const BeamHypothesis& a, const BeamHypothesis& b) { return a.score > b.score; });
  if (finished_.size() > nb) finished_.resize(nb);
  running_ = std::move(next);
  generated_ = new_len;

  done_ = at_max || running_.empty() ||
          (early_stopping_ == EarlyStopping::kAlways && finished_.size() >= nb) ||
          no_improvement_possible();
  if (done_) {
    running_.clear();
    continuations.clear();
  }
  return continuations;
}

const BeamHypothesis& BeamSearch::best() const {
  KILN_CHECK(done_, "beam search: best() before the search finished");
  KILN_CHECK(!finished_.empty(), "beam search ended without a hypothesis");
  return finished_.front();
}

}  // namespace kiln
