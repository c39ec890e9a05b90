// The model as the runtime sees it, independent of its architecture: how many layers own a KV
// cache and how wide their rows are, the vocabulary, the special ids, whether an encoder runs
// first, and the generation defaults the checkpoint ships. Frontends fill it in from their typed
// configs; plans store it; the runtime reads only this (it never branches on the architecture).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

// generation_config's "early_stopping" in HF's three values (false, true, "never"). The runtime
// maps it onto GenerationParams' EarlyStopping: the public API (kiln/generate.h) describes
// requests, which nothing below the runtime knows about.
enum class EarlyStoppingSetting : uint8_t { kHeuristic, kAlways, kNever };
// The widest beam search a checkpoint's defaults may ask for: the runtime's kMaxBeams (the
// runtime checks that the two agree).
inline constexpr int kMaxBeamsSetting = 32;

// generation_config.json as HuggingFace applies it: every field is optional, and an absent field
// keeps the library default (the runtime's GenerationParams, whose member initialisers are HF's).
struct GenerationDefaults {
  std::optional<int64_t> max_new_tokens;
  std::optional<int64_t> max_length;  // HF: prompt + generated (decoder-only) or decoder length
  std::optional<int64_t> min_new_tokens;
  std::optional<int> num_beams;
  std::optional<double> length_penalty;
  std::optional<EarlyStoppingSetting> early_stopping;
  std::optional<bool> do_sample;
  std::optional<float> temperature;
  std::optional<int> top_k;
  std::optional<float> top_p;
  std::optional<double> repetition_penalty;
  std::optional<int> no_repeat_ngram_size;
  std::optional<int> encoder_no_repeat_ngram_size;
  std::optional<std::vector<std::vector<int64_t>>> bad_words_ids;
  std::optional<std::vector<int64_t>> suppress_tokens;
  std::optional<int64_t> min_length;
  std::optional<int64_t> forced_bos_token_id;
  std::optional<std::vector<int64_t>> forced_eos_token_ids;
  std::vector<int64_t> eos_token_ids;  // empty: the model's
  bool operator==(const GenerationDefaults&) const = default;
};

struct ModelDesc {
  std::string architecture;  // "t5", "bloom": for people and plan metadata only
  bool encoder_decoder = false;
  int64_t vocab_size = 0;  // rows of the logits
  // Self-attention KV cache: one per decoder layer, rows of num_heads * head_dim.
  int cache_layers = 0;
  int num_heads = 0;
  int head_dim = 0;
  std::vector<int64_t> eos_token_ids;  // generation stops at any of them
  int64_t pad_token_id = 0;
  int64_t decoder_start_token_id = 0;  // encoder-decoder: the first decoder input
  int64_t max_positions = 0;           // the default longest prompt (T5 512, BLOOM 2048)
  GenerationDefaults generation;

  int64_t cache_row_width() const { return static_cast<int64_t>(num_heads) * head_dim; }
  bool operator==(const ModelDesc&) const = default;
};

// Checks every count is positive and every id inside the vocabulary; throws naming `source`.
void check_model_desc(const ModelDesc& desc, const std::string& source);

}  // namespace kiln
