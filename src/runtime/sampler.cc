#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/status.h"

namespace kiln {

int64_t argmax(std::span<const float> logits) {
  KILN_CHECK(!logits.empty(), "argmax of empty logits");
  int64_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int64_t>(i);
  return best;
}

void log_softmax(std::span<const float> logits, std::vector<float>* out) {
  out->resize(logits.size());
  const float mx = *std::max_element(logits.begin(), logits.end());
  float sum = 0.0f;
  for (float v : logits) sum += std::exp(v - mx);
  const float lse = mx + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) (*out)[i] = logits[i] - lse;
}

int64_t sample_token(std::span<const float> logits, const GenerationParams& p,
                     std::mt19937_64& rng) {
  const size_t n = logits.size();
  std::vector<float> scaled(logits.begin(), logits.end());
  const float t = p.temperature;
  for (float& v : scaled) v /= t;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return scaled[a] > scaled[b]; });
  size_t keep = n;
  if (p.top_k > 0) keep = std::min(keep, static_cast<size_t>(p.top_k));
  std::vector<float> best(keep);
  for (size_t i = 0; i < keep; ++i) best[i] = scaled[order[i]];
  return sample_sorted(best, std::span<const int64_t>(order.data(), keep), p, rng);
}

int64_t sample_sorted(std::span<const float> scaled, std::span<const int64_t> ids,
                      const GenerationParams& p, std::mt19937_64& rng) {
  KILN_CHECK(!scaled.empty() && scaled.size() == ids.size(), "sampling from {} values and {} ids",
             scaled.size(), ids.size());
  size_t keep = scaled.size();
  if (p.top_k > 0) keep = std::min(keep, static_cast<size_t>(p.top_k));
  const float mx = scaled[0];
  std::vector<double> probs(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += (probs[i] = std::exp(scaled[i] - mx));
  if (p.top_p < 1.0f) {
    // Keep the smallest prefix whose probability mass reaches top_p (at least one token).
    double mass = 0.0;
    size_t cut = 0;
    while (cut < keep) {
      mass += probs[cut] / total;
      ++cut;
      if (mass >= p.top_p) break;
    }
    keep = cut;
    probs.resize(keep);
    total = std::accumulate(probs.begin(), probs.end(), 0.0);
  }
  std::uniform_real_distribution<double> uniform(0.0, total);
  double r = uniform(rng);
  for (size_t i = 0; i < keep; ++i) {
    r -= probs[i];
    if (r < 0.0) return ids[i];
  }
  return ids[keep - 1];
}

void validate(const GenerationParams& p) {
  KILN_CHECK_USAGE(p.max_new_tokens >= 0 && p.max_new_tokens <= kMaxNewTokensLimit,
                   "max-new-tokens must be in 1..{}, got {}", kMaxNewTokensLimit, p.max_new_tokens);
  KILN_CHECK_USAGE(p.max_new_tokens > 0 || p.max_length > 0,
                   "max-new-tokens must be in 1..{}, got {}", kMaxNewTokensLimit, p.max_new_tokens);
  KILN_CHECK_USAGE(p.max_length >= 0, "max-length must be >= 0, got {}", p.max_length);
  KILN_CHECK_USAGE(p.min_new_tokens >= 0, "min-new-tokens must be >= 0, got {}", p.min_new_tokens);
  KILN_CHECK_USAGE(p.num_beams >= 1 && p.num_beams <= kMaxBeams, "beams must be in 1..{}, got {}",
                   kMaxBeams, p.num_beams);
  KILN_CHECK_USAGE(!(p.do_sample && p.num_beams > 1),
                   "sampling with beam search is not supported: use --beams 1 with --temperature");
  KILN_CHECK_USAGE(p.temperature > 0.0f && std::isfinite(p.temperature),
                   "temperature must be > 0, got {}", p.temperature);
  KILN_CHECK_USAGE(p.top_k >= 0, "top-k must be >= 0, got {}", p.top_k);
  KILN_CHECK_USAGE(p.top_p > 0.0f && p.top_p <= 1.0f, "top-p must be in (0, 1], got {}", p.top_p);
  KILN_CHECK_USAGE(std::isfinite(p.length_penalty), "length-penalty must be finite");
  KILN_CHECK_USAGE(!(p.ignore_eos && p.num_beams > 1),
                   "ignoring EOS is for greedy or sampled generation, not beam search");
}

}  // namespace kiln
