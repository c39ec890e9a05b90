// Beam search bookkeeping against outcomes worked out by hand from HuggingFace transformers'
// `_beam_search` (generation/utils.py: _get_top_k_continuations,
// _get_running_beams_for_next_iteration, _update_finished_beams, _check_early_stop_heuristic,
// _beam_search_has_unfinished_sequences). Each scenario is a scripted "model": the log-prob row
// that follows each prefix. Unnamed tokens get kFiller, far below every named one. The rows need
// not be normalised: beam search only adds and compares them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "core/status.h"
#include "runtime/beam_search.h"

namespace kiln::test {
namespace {

constexpr int64_t kVocab = 8;
constexpr int64_t kEos = 1;
constexpr float kFiller = -50.0f;

using Row = std::map<int64_t, float>;
using Script = std::map<std::vector<int64_t>, Row>;

std::vector<float> dense(const Row& row) {
  std::vector<float> out(static_cast<size_t>(kVocab), kFiller);
  for (const auto& [token, lp] : row) out[static_cast<size_t>(token)] = lp;
  return out;
}

struct Outcome {
  BeamHypothesis best;
  std::vector<BeamHypothesis> finished;
  int steps = 0;
};

// Steps until done, feeding each running beam the row its prefix is scripted with.
Outcome run_script(const GenerationParams& params, const Script& script,
                   std::vector<int64_t> eos_ids = {kEos}) {
  BeamSearch search(params, std::move(eos_ids));
  Outcome out;
  while (!search.done() && out.steps < 100) {
    std::vector<float> rows;
    for (int b = 0; b < search.num_running(); ++b) {
      const std::vector<int64_t>& prefix = search.running_tokens(b);
      const auto it = script.find(prefix);
      if (it == script.end())
        ADD_FAILURE() << "no row scripted after " << ::testing::PrintToString(prefix);
      const std::vector<float> row = dense(it == script.end() ? Row{} : it->second);
      rows.insert(rows.end(), row.begin(), row.end());
    }
    search.step(rows, kVocab);
    ++out.steps;
  }
  EXPECT_TRUE(search.done());
  out.best = search.best();
  out.finished = search.finished();
  return out;
}

GenerationParams beams(int num_beams, int64_t max_new_tokens, double length_penalty,
                       EarlyStopping early_stopping) {
  GenerationParams p;
  p.num_beams = num_beams;
  p.max_new_tokens = max_new_tokens;
  p.length_penalty = length_penalty;
  p.early_stopping = early_stopping;
  return p;
}

void expect_hypothesis(const BeamHypothesis& h, const std::vector<int64_t>& tokens, float score,
                       bool eos) {
  EXPECT_EQ(h.tokens, tokens);
  EXPECT_NEAR(h.score, score, 1e-5f) << ::testing::PrintToString(tokens);
  EXPECT_EQ(h.eos, eos) << ::testing::PrintToString(tokens);
}

// Two beams, length_penalty 1, max_new_tokens 6; K = 2 * 2 = 4 candidates per step.
//  step 1: [2] -0.1, [3] -0.2 run (EOS at -50 ranks 4th: dropped).
//  step 2: [2,4] -0.3 runs; [2]+EOS -0.4 is rank 1, finished H1 = [2], -0.4/2 = -0.2;
//          [3,5] -0.6 runs.
//  step 3: [2,4,6] -0.6 runs; [2,4]+EOS -0.9 finished H2 = [2,4], -0.9/3 = -0.3; [3,5,7] -1.0.
//          Two hypotheses now: True stops here, best H1.
//          False: best running -0.6 / 3 = -0.2 > worst -0.3, go on.
//          "never": -0.6 / 6 = -0.1 > -0.3, go on.
//  step 4: [2,4,6]+EOS -0.7 finished H3 = [2,4,6], -0.7/4 = -0.175 (H2 drops out);
//          [2,4,6,2] -0.9 and [3,5,7,3] -1.1 run.
//          False: -0.9 / 4 = -0.225 is not > worst -0.2: stop, best H3.
//          "never": -0.9 / 6 = -0.15 > -0.2, go on.
//  step 5: [2,4,6,2,4] -0.95 and [3,5,7,3,5] -1.15 run.  "never": -0.95/6 > -0.2, go on.
//  step 6 (max_new_tokens): [2,4,6,2,4]+EOS -1.0 → -1/6 = -0.1667 (eos);
//          [3,5,7,3,5,6] -1.16 → -0.1933 (ended by length). Best -0.1667 beats H3.
const Script kModes = {
    {{}, {{2, -0.1f}, {3, -0.2f}}},
    {{2}, {{kEos, -0.3f}, {4, -0.2f}}},
    {{3}, {{5, -0.4f}}},
    {{2, 4}, {{kEos, -0.6f}, {6, -0.3f}}},
    {{3, 5}, {{7, -0.4f}}},
    {{2, 4, 6}, {{kEos, -0.1f}, {2, -0.3f}}},
    {{3, 5, 7}, {{3, -0.1f}}},
    {{2, 4, 6, 2}, {{4, -0.05f}}},
    {{3, 5, 7, 3}, {{5, -0.05f}}},
    {{2, 4, 6, 2, 4}, {{kEos, -0.05f}, {6, -0.5f}}},
    {{3, 5, 7, 3, 5}, {{6, -0.01f}}},
};

TEST(BeamSearchEarlyStopping, TrueStopsOnceNumBeamsHypothesesFinished) {
  const Outcome o = run_script(beams(2, 6, 1.0, EarlyStopping::kAlways), kModes);
  EXPECT_EQ(o.steps, 3);
  expect_hypothesis(o.best, {2}, -0.2f, true);
  ASSERT_EQ(o.finished.size(), 2u);
  expect_hypothesis(o.finished[1], {2, 4}, -0.3f, true);
}

TEST(BeamSearchEarlyStopping, FalseStopsWhenBestRunningAtCurrentLengthCannotWin) {
  const Outcome o = run_script(beams(2, 6, 1.0, EarlyStopping::kHeuristic), kModes);
  EXPECT_EQ(o.steps, 4);
  expect_hypothesis(o.best, {2, 4, 6}, -0.175f, true);
  // H2 (-0.3) was pushed out by H3: only the best num_beams hypotheses are kept.
  ASSERT_EQ(o.finished.size(), 2u);
  expect_hypothesis(o.finished[1], {2}, -0.2f, true);
}

TEST(BeamSearchEarlyStopping, NeverBoundsRunningBeamsByMaxLengthForPositivePenalty) {
  const Outcome o = run_script(beams(2, 6, 1.0, EarlyStopping::kNever), kModes);
  EXPECT_EQ(o.steps, 6);
  expect_hypothesis(o.best, {2, 4, 6, 2, 4}, -1.0f / 6.0f, true);
  ASSERT_EQ(o.finished.size(), 2u);
  expect_hypothesis(o.finished[1], {2, 4, 6}, -0.175f, true);
}

TEST(BeamSearchEarlyStopping, DefaultIsHuggingFacesFalse) {
  EXPECT_EQ(GenerationParams{}.early_stopping, EarlyStopping::kHeuristic);
}

// HF's "never" uses max_length only when length_penalty > 0; otherwise the current length, like
// False. length_penalty -1: score = sum * length.
//  step 1: [2] -0.05 runs; EOS -0.4 finished Ha = [], -0.4 * 1; [3] -0.5 runs.
//  step 2: [2,4] -0.1 runs; [2]+EOS -0.25 finished Hb = [2], -0.25 * 2 = -0.5; [3,5] -0.6.
//          True: two hypotheses, stop with Ha.
//          Current length: -0.1 * 2 = -0.2 > worst -0.5, go on. (max_new_tokens would give
//          -0.1 * 6 = -0.6, not > -0.5, and stop with Ha.)
//  step 3: [2,4]+EOS -0.11 finished Hc = [2,4], -0.11 * 3 = -0.33, the new best;
//          best running [2,4,6] -1.1 * 3 = -3.3 cannot beat -0.4: stop.
TEST(BeamSearchEarlyStopping, NeverWithNegativePenaltyUsesCurrentLength) {
  const Script script = {
      {{}, {{kEos, -0.4f}, {2, -0.05f}, {3, -0.5f}}},
      {{2}, {{kEos, -0.2f}, {4, -0.05f}}},
      {{3}, {{5, -0.1f}}},
      {{2, 4}, {{kEos, -0.01f}, {6, -1.0f}}},
      {{3, 5}, {{7, -1.0f}}},
  };
  for (EarlyStopping mode : {EarlyStopping::kNever, EarlyStopping::kHeuristic}) {
    const Outcome o = run_script(beams(2, 6, -1.0, mode), script);
    EXPECT_EQ(o.steps, 3);
    expect_hypothesis(o.best, {2, 4}, -0.33f, true);
  }
  const Outcome always = run_script(beams(2, 6, -1.0, EarlyStopping::kAlways), script);
  EXPECT_EQ(always.steps, 2);
  expect_hypothesis(always.best, {}, -0.4f, true);
}

// Same two hypotheses under every penalty (True stops once both exist); the penalty picks the
// winner. The length counts the EOS token, as HF's cur_len + 1 - decoder_prompt_len does.
//  step 1: [2] -0.1, [3] -0.2 run.
//  step 2: [3,4] -0.5 runs; [2]+EOS -0.6 finished S = [2] (length 2); [2,6] -3.1 runs.
//  step 3: [3,4,5] -0.7 and [2,6,7] -4.1 run.
//  step 4: [3,4,5]+EOS -1.0 finished L = [3,4,5] (length 4): two hypotheses, stop.
// penalty 1: S -0.3 < L -0.25, L wins. 0.5: S -0.6/sqrt(2) = -0.424 > L -1/2, S wins.
// 0: raw sums, S wins. (Without counting EOS, 0.5 would give S -0.6 < L -1/sqrt(3) = -0.577.)
TEST(BeamSearchLengthPenalty, PenaltyChangesTheWinner) {
  const Script script = {
      {{}, {{2, -0.1f}, {3, -0.2f}}},
      {{2}, {{kEos, -0.5f}, {6, -3.0f}}},
      {{3}, {{4, -0.3f}}},
      {{3, 4}, {{5, -0.2f}}},
      {{2, 6}, {{7, -1.0f}}},
      {{3, 4, 5}, {{kEos, -0.3f}, {2, -2.0f}}},
      {{2, 6, 7}, {{2, -1.0f}}},
  };
  const Outcome one = run_script(beams(2, 10, 1.0, EarlyStopping::kAlways), script);
  expect_hypothesis(one.best, {3, 4, 5}, -0.25f, true);
  ASSERT_EQ(one.finished.size(), 2u);
  expect_hypothesis(one.finished[1], {2}, -0.3f, true);

  const Outcome half = run_script(beams(2, 10, 0.5, EarlyStopping::kAlways), script);
  expect_hypothesis(half.best, {2}, -0.6f / std::sqrt(2.0f), true);
  ASSERT_EQ(half.finished.size(), 2u);
  expect_hypothesis(half.finished[1], {3, 4, 5}, -0.5f, true);

  const Outcome none = run_script(beams(2, 10, 0.0, EarlyStopping::kAlways), script);
  expect_hypothesis(none.best, {2}, -0.6f, true);
}

// At max_new_tokens every top-num_beams candidate finishes, EOS or not; only EOS is left out of
// the tokens. max_new_tokens 2:
//  step 1: [2] -0.1, [3] -0.2 run.
//  step 2: [2,4] -0.2 → -0.2/2 = -0.1 (length); [3]+EOS -0.25 → -0.125 (eos);
//          [3,5] -0.4 and [2]+EOS -0.6 rank below num_beams: dropped.
TEST(BeamSearchEos, MaxNewTokensFinishesTopBeamsWithOrWithoutEos) {
  const Script script = {
      {{}, {{2, -0.1f}, {3, -0.2f}}},
      {{2}, {{4, -0.1f}, {kEos, -0.5f}}},
      {{3}, {{kEos, -0.05f}, {5, -0.2f}}},
  };
  for (EarlyStopping mode :
       {EarlyStopping::kHeuristic, EarlyStopping::kAlways, EarlyStopping::kNever}) {
    const Outcome o = run_script(beams(2, 2, 1.0, mode), script);
    EXPECT_EQ(o.steps, 2);
    expect_hypothesis(o.best, {2, 4}, -0.1f, false);
    ASSERT_EQ(o.finished.size(), 2u);
    expect_hypothesis(o.finished[1], {3}, -0.125f, true);
  }
}

// max_new_tokens 1: one step; the top num_beams candidates are the hypotheses, the rest dropped.
TEST(BeamSearchEos, SingleTokenBudget) {
  BeamSearch search(beams(3, 1, 1.0, EarlyStopping::kHeuristic), {kEos});
  const auto next = search.step(dense({{2, -0.5f}, {kEos, -0.7f}, {3, -0.9f}, {4, -1.5f}}), kVocab);
  EXPECT_TRUE(next.empty());
  ASSERT_TRUE(search.done());
  EXPECT_EQ(search.num_running(), 0);
  ASSERT_EQ(search.finished().size(), 3u);
  expect_hypothesis(search.best(), {2}, -0.5f, false);
  expect_hypothesis(search.finished()[1], {}, -0.7f, true);
  expect_hypothesis(search.finished()[2], {3}, -0.9f, false);
}

// An EOS candidate ranked below num_beams neither finishes nor runs.
TEST(BeamSearchEos, LowRankedEosIsDropped) {
  BeamSearch search(beams(2, 5, 1.0, EarlyStopping::kHeuristic), {kEos});
  const auto next = search.step(dense({{2, -0.1f}, {3, -0.2f}, {kEos, -0.3f}}), kVocab);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].parent, 0);
  EXPECT_EQ(next[0].token, 2);
  EXPECT_EQ(next[1].parent, 0);
  EXPECT_EQ(next[1].token, 3);
  EXPECT_TRUE(search.finished().empty());
  EXPECT_FALSE(search.done());
}

// With two EOS ids HF keeps (1 + 2) * num_beams = 6 candidates, so beams survive a step whose
// top four candidates all end. "never", length_penalty 1, max_new_tokens 5.
//  step 1: EOS 1 -0.1 and EOS 7 -0.2 finish (two empty hypotheses); [2] -0.3, [3] -0.4 run.
//          Bound -0.3/5 = -0.06 > worst -0.2: go on.
//  step 2: [2]+1 -0.31 → -0.155 and [2]+7 -0.32 → -0.16 finish (ranks 0, 1); [3]+1, [3]+7
//          (ranks 2, 3) are dropped; ranks 4, 5 run: [2,4] -0.6 and [3,5] -0.7.
//          Kept hypotheses: -0.1 and -0.155. Bound -0.6/5 = -0.12 > -0.155: go on.
TEST(BeamSearchEos, SeveralEosIdsWidenTheCandidates) {
  BeamSearch search(beams(2, 5, 1.0, EarlyStopping::kNever), {kEos, 7});
  const auto first =
      search.step(dense({{kEos, -0.1f}, {7, -0.2f}, {2, -0.3f}, {3, -0.4f}}), kVocab);
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(search.finished().size(), 2u);
  std::vector<float> rows = dense({{kEos, -0.01f}, {7, -0.02f}, {4, -0.3f}});
  const std::vector<float> second_row = dense({{kEos, -0.01f}, {7, -0.02f}, {5, -0.3f}});
  rows.insert(rows.end(), second_row.begin(), second_row.end());
  const auto next = search.step(rows, kVocab);
  ASSERT_FALSE(search.done());
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].parent, 0);
  EXPECT_EQ(next[0].token, 4);
  EXPECT_EQ(next[1].parent, 1);
  EXPECT_EQ(next[1].token, 5);
  EXPECT_EQ(search.running_tokens(0), (std::vector<int64_t>{2, 4}));
  EXPECT_NEAR(search.running_score(1), -0.7f, 1e-6f);
  ASSERT_EQ(search.finished().size(), 2u);
  expect_hypothesis(search.finished()[0], {}, -0.1f, true);
  expect_hypothesis(search.finished()[1], {2}, -0.155f, true);
}

// Equal scores keep a fixed order: earlier beams first, and within a beam lower token ids first
// (step 2: all four continuations sum to -1.5; beam 0's two win).
TEST(BeamSearchTies, EarlierBeamThenLowerToken) {
  BeamSearch search(beams(2, 5, 1.0, EarlyStopping::kHeuristic), {kEos});
  const auto first = search.step(dense({{5, -1.0f}, {4, -1.0f}, {3, -1.0f}, {2, -1.0f}}), kVocab);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].token, 2);
  EXPECT_EQ(first[1].token, 3);
  const std::vector<float> row = dense({{6, -0.5f}, {4, -0.5f}});
  std::vector<float> rows = row;
  rows.insert(rows.end(), row.begin(), row.end());
  const auto next = search.step(rows, kVocab);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].parent, 0);
  EXPECT_EQ(next[0].token, 4);
  EXPECT_EQ(next[1].parent, 0);
  EXPECT_EQ(next[1].token, 6);
}

TEST(BeamSearchBadUse, WrongRowsAndUseAfterDone) {
  BeamSearch search(beams(2, 1, 1.0, EarlyStopping::kHeuristic), {kEos});
  EXPECT_THROW(search.best(), Error);
  EXPECT_THROW(search.step(std::vector<float>(kVocab * 2, -1.0f), kVocab), Error);
  search.step(dense({{2, -0.1f}}), kVocab);
  ASSERT_TRUE(search.done());
  EXPECT_THROW(search.step(dense({{2, -0.1f}}), kVocab), Error);
  EXPECT_THROW(search.running_tokens(0), Error);
}

// A device hands beam search each row's best candidates_per_row() tokens instead of the row
// (TokenSelector::top_k_rows): the search must take the same steps and end with the same hypotheses
// as from the dense rows, ties included, over a random model with coarse (tied) log-probs.
TEST(BeamSearchCandidates, BestTokensPerRowStepAsTheWholeRows) {
  constexpr int64_t vocab = 40;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> level(-40, 0);
  for (int trial = 0; trial < 20; ++trial) {
    GenerationParams p = beams(1 + trial % 4, 3 + trial % 5, trial % 3 == 0 ? -0.5 : 1.0,
                               static_cast<EarlyStopping>(trial % 3));
    BeamSearch dense_search(p, {kEos, 7}), sparse_search(p, {kEos, 7});
    while (!dense_search.done()) {
      ASSERT_FALSE(sparse_search.done());
      ASSERT_EQ(dense_search.num_running(), sparse_search.num_running());
      std::vector<float> rows;
      std::vector<std::vector<BeamSearch::TokenLogProb>> best;
      for (int b = 0; b < dense_search.num_running(); ++b) {
        std::vector<BeamSearch::TokenLogProb> row;
        for (int64_t t = 0; t < vocab; ++t) {
          const float lp = level(rng) * 0.25f;
          rows.push_back(lp);
          row.push_back({t, lp});
        }
        std::stable_sort(row.begin(), row.end(),
                         [](const auto& a, const auto& c) { return a.log_prob > c.log_prob; });
        row.resize(sparse_search.candidates_per_row());
        best.push_back(std::move(row));
      }
      const auto want = dense_search.step(rows, vocab);
      const auto got =
          sparse_search.step(std::span<const std::vector<BeamSearch::TokenLogProb>>(best));
      ASSERT_EQ(want.size(), got.size()) << trial;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(want[i].parent, got[i].parent) << trial;
        EXPECT_EQ(want[i].token, got[i].token) << trial;
      }
    }
    ASSERT_TRUE(sparse_search.done());
    ASSERT_EQ(dense_search.finished().size(), sparse_search.finished().size());
    for (size_t i = 0; i < dense_search.finished().size(); ++i) {
      EXPECT_EQ(dense_search.finished()[i].tokens, sparse_search.finished()[i].tokens) << trial;
      EXPECT_EQ(dense_search.finished()[i].score, sparse_search.finished()[i].score) << trial;
    }
  }
}

}  // namespace
}  // namespace kiln::test
