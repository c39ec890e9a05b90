#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>

#include "core/status.h"

namespace kiln {

int64_t argmax(std::span<const float> logits) {
  KILN_CHECK(!logits.empty(), "argmax of empty logits");
  int64_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int64_t>(i);
  return best;
}

uint64_t derive_seed(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
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

void validate(const GenerationParams& p, int64_t vocab_size) {
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
  KILN_CHECK_USAGE(p.repetition_penalty > 0.0f && std::isfinite(p.repetition_penalty),
                   "repetition-penalty must be > 0, got {}", p.repetition_penalty);
  KILN_CHECK_USAGE(p.no_repeat_ngram_size >= 0, "no-repeat-ngram-size must be >= 0, got {}",
                   p.no_repeat_ngram_size);
  KILN_CHECK_USAGE(p.encoder_no_repeat_ngram_size >= 0,
                   "encoder-no-repeat-ngram-size must be >= 0, got {}",
                   p.encoder_no_repeat_ngram_size);
  KILN_CHECK_USAGE(p.min_length >= 0, "min-length must be >= 0, got {}", p.min_length);
  auto check_id = [&](std::string_view what, int64_t id) {
    KILN_CHECK_USAGE(id >= 0 && (vocab_size <= 0 || id < vocab_size),
                     "{}: token id {} is outside the vocabulary [0, {})", what, id, vocab_size);
  };
  for (const std::vector<int64_t>& words : p.bad_words_ids) {
    KILN_CHECK_USAGE(!words.empty(), "bad-words-ids: an empty list of ids bans nothing");
    for (int64_t id : words) check_id("bad-words-ids", id);
  }
  for (int64_t id : p.suppress_tokens) check_id("suppress-tokens", id);
  if (p.forced_bos_token_id >= 0) check_id("forced-bos-token-id", p.forced_bos_token_id);
  for (int64_t id : p.forced_eos_token_ids) check_id("forced-eos-token-id", id);
  KILN_CHECK_USAGE(p.stop_strings.size() <= kMaxStopStrings, "stop: at most {} strings, got {}",
                   kMaxStopStrings, p.stop_strings.size());
  for (const std::string& s : p.stop_strings)
    KILN_CHECK_USAGE(!s.empty() && s.size() <= kMaxStopStringBytes,
                     "stop: each string must be 1..{} bytes, got {}", kMaxStopStringBytes,
                     s.size());
  KILN_CHECK_USAGE(p.stop_strings.empty() || p.num_beams == 1,
                   "stop strings work with greedy or sampled generation, not beam search "
                   "(beams {})",
                   p.num_beams);
}

}  // namespace kiln
