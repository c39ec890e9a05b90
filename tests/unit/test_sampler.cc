// Sampling from a row's best candidates (what a device returns, runtime/sampler.h sample_sorted)
// draws exactly the token sampling from the whole row draws, for the same RNG state, across
// temperatures, top-k, top-p and tied logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/status.h"
#include "runtime/sampler.h"

namespace kiln::test {
namespace {

TEST(Sampler, BestCandidatesDrawWhatTheWholeRowDraws) {
  std::mt19937 gen(21);
  std::uniform_int_distribution<int> level(-60, 20);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  int differing_top_k = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> row(500);
    for (float& v : row) v = level(gen) * 0.125f;  // coarse: many ties
    GenerationParams p;
    p.do_sample = true;
    p.temperature = 0.3f + 1.5f * unit(gen);
    p.top_k = 1 + trial % 60;
    p.top_p = trial % 2 ? 1.0f : 0.3f + 0.7f * unit(gen);
    std::vector<float> scaled(row);
    for (float& v : scaled) v /= p.temperature;
    std::vector<int64_t> order(row.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return scaled[a] > scaled[b]; });
    order.resize(static_cast<size_t>(p.top_k));
    std::vector<float> best;
    for (int64_t id : order) best.push_back(scaled[id]);
    std::mt19937_64 whole(trial), candidates(trial);
    for (int draw = 0; draw < 20; ++draw) {
      const int64_t want = sample_token(row, p, whole);
      ASSERT_EQ(sample_sorted(best, order, p, candidates), want) << trial << " draw " << draw;
      differing_top_k += want != order[0];
    }
  }
  EXPECT_GT(differing_top_k, 100);  // the draws do sample, not only take the best
}

TEST(Sampler, BadInputNoCandidates) {
  GenerationParams p;
  std::mt19937_64 rng(1);
  EXPECT_THROW(sample_sorted({}, {}, p, rng), Error);
  const std::vector<float> v = {1.0f, 0.5f};
  const std::vector<int64_t> ids = {3};
  EXPECT_THROW(sample_sorted(v, ids, p, rng), Error);
}

}  // namespace
}  // namespace kiln::test
