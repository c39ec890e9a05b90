// Generation requests: decoding strategy and limits, and what comes back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

inline constexpr int kMaxBeams = 32;
inline constexpr int64_t kMaxNewTokensLimit = 8192;
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;

// HuggingFace's three beam-search stopping rules (generation_config "early_stopping").
enum class EarlyStopping : uint8_t {
  kHeuristic,  // false (HF's default): stop when no running beam can beat the kept hypotheses
  kAlways,     // true: stop as soon as num_beams hypotheses are finished
  kNever,      // "never": stop only when no better hypothesis is possible at all
};

// Member initialisers are HuggingFace's GenerationConfig defaults, except max_new_tokens (HF
// has max_length = 20 counting the prompt; kiln defaults to 16 new tokens). A model's
// generation_config.json replaces them (default_generation_params), and callers override those.
struct GenerationParams {
  int64_t max_new_tokens = 16;  // 0: derive from max_length
  int64_t max_length = 0;       // HF: prompt + new tokens (decoder-only) or decoder length
  int64_t min_new_tokens = 0;   // EOS is not generated before this many tokens
  int num_beams = 1;            // > 1: beam search (HF semantics)
  double length_penalty = 1.0;  // beam score = sum log p / generated_len ^ length_penalty
  EarlyStopping early_stopping = EarlyStopping::kHeuristic;
  bool do_sample = false;  // sampling instead of greedy (num_beams must be 1)
  float temperature = 1.0f;
  int top_k = 50;           // 0: off (HF's default is 50 when sampling)
  float top_p = 1.0f;       // 1: off
  uint64_t seed = 0;        // sampling: the random stream (a batch's prompt i gets a derived one)
  bool ignore_eos = false;  // generate exactly max_new_tokens (benchmarks); greedy/sampling only

  // HF's logits processors, applied in HF's order to every step's logits (to its log-softmax in
  // beam search) before the token is chosen; "the sequence" is the prompt and the generated
  // tokens (decoder-only) or the decoder start token and the generated tokens (encoder-decoder),
  // as HF's input_ids.
  float repetition_penalty = 1.0f;       // > 1: tokens of the sequence are less likely (CTRL)
  int no_repeat_ngram_size = 0;          // no n-gram occurs twice in the sequence
  int encoder_no_repeat_ngram_size = 0;  // encoder-decoder: no n-gram of the prompt is repeated
  std::vector<std::vector<int64_t>> bad_words_ids;  // never completed (a lone EOS is ignored)
  std::vector<int64_t> suppress_tokens;             // never generated
  int64_t min_length = 0;            // EOS banned while the sequence is shorter (HF's min_length)
  int64_t forced_bos_token_id = -1;  // the first token when the sequence is one token long
  std::vector<int64_t> forced_eos_token_ids;  // the last token when max_new_tokens is reached

  // Generation ends where the generated text first contains one of these (FinishReason::kStop);
  // the text returned stops before it. Needs text, so the executor applies them (the Engine and
  // the server); greedy and sampling only.
  std::vector<std::string> stop_strings;

  // Whether any processor above is on (min_new_tokens and min_length only ban EOS).
  bool processes_logits() const {
    return repetition_penalty != 1.0f || no_repeat_ngram_size > 0 ||
           encoder_no_repeat_ngram_size > 0 || !bad_words_ids.empty() || !suppress_tokens.empty() ||
           forced_bos_token_id >= 0 || !forced_eos_token_ids.empty();
  }
};

// Throws a usage error naming the bad field; ids are checked against the vocabulary when
// vocab_size > 0.
void validate(const GenerationParams& params, int64_t vocab_size = 0);

// kEos: the model ended the sequence; kStop: a stop string did; kLength: the token limit.
enum class FinishReason { kEos, kLength, kCancelled, kStop };

struct GenerationResult {
  std::vector<int64_t> output_ids;  // generated ids: no prompt, no start token, no EOS
  FinishReason finish_reason = FinishReason::kLength;
  float score = 0.0f;  // beam search: the hypothesis' length-normalised score
};

}  // namespace kiln
