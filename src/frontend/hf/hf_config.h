// HuggingFace config.json / generation_config.json as typed structs. Only fields that change
// numerics or generation are kept; missing fields take HuggingFace's defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "graph/attrs.h"
#include "graph/model_desc.h"

namespace kiln {

struct T5Config {
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;  // may differ from d_model / num_heads
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_decoder_layers = 6;  // defaults to num_layers when absent
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  // feed_forward_proj "relu" | "gelu" | "gated-gelu" | "gated-silu" ...: gated + activation.
  bool gated_ffn = false;
  Activation ffn_activation = Activation::kRelu;
  bool tie_word_embeddings = true;
  // Multiply the decoder output by d_model^-0.5 before lm_head: scale_decoder_outputs when
  // present, else tie_word_embeddings.
  bool scale_decoder_outputs = true;
  int64_t pad_token_id = 0;
  int64_t eos_token_id = 1;
  int64_t decoder_start_token_id = 0;  // defaults to pad_token_id when absent
  bool operator==(const T5Config&) const = default;
};

struct BloomConfig {
  int64_t vocab_size = 250880;
  int64_t hidden_size = 64;
  int64_t n_layer = 2;
  int64_t n_head = 8;
  double layer_norm_epsilon = 1e-5;
  bool apply_residual_connection_post_layernorm = false;
  bool tie_word_embeddings = true;
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 3;
  bool operator==(const BloomConfig&) const = default;
};

enum class Architecture : uint8_t { kT5, kBloom };
std::string_view architecture_name(Architecture a);

struct ModelConfig {
  Architecture arch;
  std::variant<T5Config, BloomConfig> config;
  GenerationDefaults generation;
  // generation_config settings HF applies and kiln does not, as "name (value)": the build warns.
  std::vector<std::string> unsupported_generation;
  const T5Config& t5() const { return std::get<T5Config>(config); }
  const BloomConfig& bloom() const { return std::get<BloomConfig>(config); }
  bool operator==(const ModelConfig&) const = default;
};

// Parses config.json text; `source` names the file in errors. Unknown model_type is an error
// that names it and lists the supported ones. A "generation_config" object inside (as
// model_config_to_json writes it) fills `generation`.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
void parse_generation_config(const std::string& json_text, const std::string& source,
                             GenerationDefaults* out,
                             std::vector<std::string>* unsupported = nullptr);
// Reads DIR/config.json and, when present, DIR/generation_config.json.
ModelConfig load_model_config(const std::string& dir);

// The architecture-neutral description the runtime reads (cache geometry, special ids, default
// prompt limit, generation defaults).
ModelDesc describe_model(const ModelConfig& config);

// Serialises the typed config back to JSON (stored in plans) with HuggingFace's field names;
// parse_model_config of the result gives back an equal ModelConfig.
std::string model_config_to_json(const ModelConfig& config);

}  // namespace kiln
