// Generation requests: decoding strategy and limits, and what comes back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

inline constexpr int kMaxBeams = 32;
inline constexpr int64_t kMaxNewTokensLimit = 8192;

struct GenerationParams {
  int64_t max_new_tokens = 16;
  int num_beams = 1;            // > 1: beam search (HF semantics)
  double length_penalty = 1.0;  // beam score = sum log p / generated_len ^ length_penalty
  bool early_stopping = true;   // beam search stops once num_beams hypotheses finished
  bool do_sample = false;       // sampling instead of greedy (num_beams must be 1)
  float temperature = 1.0f;
  int top_k = 0;       // 0: off
  float top_p = 1.0f;  // 1: off
  uint64_t seed = 0;
};

// Throws a usage error naming the bad field.
void validate(const GenerationParams& params);

enum class FinishReason { kEos, kLength };

struct GenerationResult {
  std::vector<int64_t> output_ids;  // generated ids: no prompt, no start token, no EOS
  FinishReason finish_reason = FinishReason::kLength;
  float score = 0.0f;  // beam search: the hypothesis' length-normalised score
};

}  // namespace kiln
