#include "frontend/hf/hf_config.h"

#include "io/json_util.h"

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/status.h"
#include "io/mmap_file.h"

namespace kiln {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kSupportedModelTypes = "t5, bloom";
constexpr const char* kGenerationKey = "generation_config";

json parse_json_object(const std::string& text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    KILN_FAIL("{}: invalid JSON: {}", source, e.what());
  }
  KILN_CHECK(doc.is_object(), "{}: expected a JSON object, got {}", source, doc.type_name());
  return doc;
}

// Typed access to one JSON object's fields. A null value counts as absent, as it does for
// transformers' config classes (e.g. "num_decoder_layers": null).
class Fields {
 public:
  Fields(const json& obj, const std::string& source) : obj_(obj), source_(source) {}

  const json* find(const char* key) const {
    const auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const char* key) const { return find(key) != nullptr; }

  std::optional<int64_t> opt_integer(const char* key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    return to_integer(key, *v);
  }
  int64_t integer(const char* key, int64_t fallback) const {
    return opt_integer(key).value_or(fallback);
  }
  // Sizes and counts: present values must be > 0.
  int64_t positive(const char* key, int64_t fallback) const {
    const std::optional<int64_t> v = opt_integer(key);
    if (!v) return fallback;
    KILN_CHECK(*v > 0, "{}: field '{}' must be positive, got {}", source_, key, *v);
    return *v;
  }
  // A size that HuggingFace accepts under two names; both present and different is an error.
  int64_t positive_alias(const char* key, const char* alias, int64_t fallback) const {
    if (has(key) && has(alias)) {
      const int64_t a = positive(key, fallback);
      const int64_t b = positive(alias, fallback);
      KILN_CHECK(a == b, "{}: fields '{}' ({}) and '{}' ({}) name the same size but disagree",
                 source_, key, a, alias, b);
      return a;
    }
    return has(alias) ? positive(alias, fallback) : positive(key, fallback);
  }
  int64_t token_id(const char* key, int64_t fallback) const {
    const int64_t v = integer(key, fallback);
    KILN_CHECK(v >= 0, "{}: field '{}' must be a non-negative token id, got {}", source_, key, v);
    return v;
  }
  std::optional<double> opt_number(const char* key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) fail_type(key, "a number", *v);
    return v->get<double>();
  }
  double positive_number(const char* key, double fallback) const {
    const double v = opt_number(key).value_or(fallback);
    KILN_CHECK(v > 0, "{}: field '{}' must be positive, got {}", source_, key, v);
    return v;
  }
  std::optional<bool> opt_boolean(const char* key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) fail_type(key, "true or false", *v);
    return v->get<bool>();
  }
  bool boolean(const char* key, bool fallback) const { return opt_boolean(key).value_or(fallback); }
  std::optional<std::string> opt_string(const char* key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) fail_type(key, "a string", *v);
    return v->get<std::string>();
  }

  int64_t to_integer(const char* key, const json& v) const {
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      KILN_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 "{}: field '{}' is out of range: {}", source_, key, u);
      return static_cast<int64_t>(u);
    }
    if (!v.is_number_integer()) fail_type(key, "an integer", v);
    return v.get<int64_t>();
  }
  [[noreturn]] void fail_type(const char* key, const char* expected, const json& v) const {
    KILN_FAIL("{}: field '{}' must be {}, got {} {}", source_, key, expected, v.type_name(),
              brief_json(v));
  }
  const std::string& source() const { return source_; }

 private:
  const json& obj_;
  const std::string& source_;
};

// transformers' ACT2FN names that kiln implements.
bool activation_from_hf(const std::string& name, Activation* out) {
  if (name == "relu") {
    *out = Activation::kRelu;
  } else if (name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "gelu_fast") {
    *out = Activation::kGeluTanh;
  } else if (name == "gelu" || name == "gelu_python") {
    *out = Activation::kGeluExact;
  } else if (name == "silu" || name == "swish") {
    *out = Activation::kSilu;
  } else {
    return false;
  }
  return true;
}

std::string_view activation_to_hf(Activation a) {
  switch (a) {
    case Activation::kRelu:
      return "relu";
    case Activation::kGeluTanh:
      return "gelu_new";
    case Activation::kGeluExact:
      return "gelu";
    case Activation::kSilu:
      return "silu";
  }
  return "?";
}

// The family name used in feed_forward_proj ("gated-gelu", "relu").
std::string_view activation_family(Activation a) {
  switch (a) {
    case Activation::kRelu:
      return "relu";
    case Activation::kGeluTanh:
    case Activation::kGeluExact:
      return "gelu";
    case Activation::kSilu:
      return "silu";
  }
  return "?";
}

constexpr const char* kSupportedActivations =
    "relu, gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, silu, swish";

// Mirrors transformers' T5Config.__init__: feed_forward_proj is "ACT" or "gated-ACT", and
// "gated-gelu" means gelu_new (tanh) for backwards compatibility while a plain "gelu" stays the
// exact erf GELU. dense_act_fn / is_gated_act in the file override what it implies, since
// transformers sets the extra keys after deriving them.
void parse_t5_ffn(const Fields& f, T5Config* c) {
  const std::string proj = f.opt_string("feed_forward_proj").value_or("relu");
  std::string act_name = proj;
  bool gated = false;
  if (const auto dash = proj.find('-'); dash != std::string::npos) {
    KILN_CHECK(proj.substr(0, dash) == "gated" && proj.find('-', dash + 1) == std::string::npos,
               "{}: field 'feed_forward_proj' is '{}', expected 'ACT' or 'gated-ACT' (e.g. "
               "'relu', 'gated-gelu')",
               f.source(), proj);
    gated = true;
    act_name = proj.substr(dash + 1);
  }
  if (proj == "gated-gelu") act_name = "gelu_new";
  Activation act;
  KILN_CHECK(activation_from_hf(act_name, &act),
             "{}: field 'feed_forward_proj' is '{}': unsupported activation '{}' (supported: {})",
             f.source(), proj, act_name, kSupportedActivations);
  if (const auto dense = f.opt_string("dense_act_fn")) {
    KILN_CHECK(activation_from_hf(*dense, &act),
               "{}: field 'dense_act_fn' is '{}', an unsupported activation (supported: {})",
               f.source(), *dense, kSupportedActivations);
  }
  c->gated_ffn = f.boolean("is_gated_act", gated);
  c->ffn_activation = act;
}

T5Config parse_t5(const Fields& f) {
  T5Config c;
  c.vocab_size = f.positive("vocab_size", c.vocab_size);
  c.d_model = f.positive("d_model", c.d_model);
  c.d_kv = f.positive("d_kv", c.d_kv);
  c.d_ff = f.positive("d_ff", c.d_ff);
  c.num_layers = f.positive("num_layers", c.num_layers);
  c.num_decoder_layers = f.positive("num_decoder_layers", c.num_layers);
  c.num_heads = f.positive("num_heads", c.num_heads);
  c.relative_attention_num_buckets =
      f.positive("relative_attention_num_buckets", c.relative_attention_num_buckets);
  c.relative_attention_max_distance =
      f.positive("relative_attention_max_distance", c.relative_attention_max_distance);
  c.layer_norm_epsilon = f.positive_number("layer_norm_epsilon", c.layer_norm_epsilon);
  parse_t5_ffn(f, &c);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", true);
  c.scale_decoder_outputs = f.boolean("scale_decoder_outputs", c.tie_word_embeddings);
  c.pad_token_id = f.token_id("pad_token_id", c.pad_token_id);
  c.eos_token_id = f.token_id("eos_token_id", c.eos_token_id);
  // T5 starts decoding from the pad token; configs that omit the key mean exactly that.
  c.decoder_start_token_id = f.token_id("decoder_start_token_id", c.pad_token_id);
  return c;
}

BloomConfig parse_bloom(const Fields& f) {
  BloomConfig c;
  c.vocab_size = f.positive("vocab_size", c.vocab_size);
  c.hidden_size = f.positive_alias("hidden_size", "n_embed", c.hidden_size);
  c.n_layer = f.positive_alias("n_layer", "num_hidden_layers", c.n_layer);
  c.n_head = f.positive_alias("n_head", "num_attention_heads", c.n_head);
  KILN_CHECK(c.hidden_size % c.n_head == 0,
             "{}: field 'hidden_size' ({}) must be divisible by 'n_head' ({})", f.source(),
             c.hidden_size, c.n_head);
  c.layer_norm_epsilon = f.positive_number("layer_norm_epsilon", c.layer_norm_epsilon);
  c.apply_residual_connection_post_layernorm = f.boolean(
      "apply_residual_connection_post_layernorm", c.apply_residual_connection_post_layernorm);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", true);
  c.bos_token_id = f.token_id("bos_token_id", c.bos_token_id);
  c.eos_token_id = f.token_id("eos_token_id", c.eos_token_id);
  c.pad_token_id = f.token_id("pad_token_id", c.pad_token_id);
  return c;
}

// A list of token ids, or one id where HF takes "an int or a list" (forced_eos_token_id).
std::vector<int64_t> token_ids(const Fields& f, const char* key, const json& v) {
  std::vector<int64_t> ids;
  if (v.is_array()) {
    for (const json& id : v) ids.push_back(f.to_integer(key, id));
  } else {
    ids.push_back(f.to_integer(key, v));
  }
  for (int64_t id : ids)
    KILN_CHECK(id >= 0, "{}: field '{}' holds a negative token id {}", f.source(), key, id);
  return ids;
}

// generation_config fields HF applies that kiln does not, with HF's default (null: none): a
// value other than the default is reported (ModelConfig::unsupported_generation).
struct UnsupportedField {
  const char* name;
  json fallback;
};
const std::vector<UnsupportedField>& unsupported_generation_fields() {
  static const std::vector<UnsupportedField> fields = {
      {"num_beam_groups", 1},
      {"diversity_penalty", 0.0},
      {"encoder_repetition_penalty", 1.0},
      {"sequence_bias", nullptr},
      {"exponential_decay_length_penalty", nullptr},
      {"typical_p", 1.0},
      {"epsilon_cutoff", 0.0},
      {"eta_cutoff", 0.0},
      {"min_p", nullptr},
      {"top_h", nullptr},
      {"renormalize_logits", false},
      {"constraints", nullptr},
      {"force_words_ids", nullptr},
      {"guidance_scale", nullptr},
      {"begin_suppress_tokens", nullptr},
      {"forced_decoder_ids", nullptr},
      {"remove_invalid_values", false},
      {"penalty_alpha", nullptr},
      {"num_return_sequences", 1},
      {"watermarking_config", nullptr},
      {"dola_layers", nullptr},
      {"max_time", nullptr},
      {"stop_strings", nullptr},
      {"prompt_lookup_num_tokens", nullptr},
      {"token_healing", false},
  };
  return fields;
}

void parse_generation_object(const json& obj, const std::string& source, GenerationDefaults* out,
                             std::vector<std::string>* unsupported) {
  const Fields f(obj, source);
  if (unsupported != nullptr)
    for (const UnsupportedField& u : unsupported_generation_fields()) {
      const json* v = f.find(u.name);
      if (v == nullptr || *v == u.fallback) continue;
      // 1 and 1.0 are HF's same default.
      if (v->is_number() && u.fallback.is_number() && v->get<double>() == u.fallback.get<double>())
        continue;
      unsupported->push_back(fmt::format("{} ({})", u.name, brief_json(*v)));
    }
  if (const auto v = f.opt_integer("max_new_tokens")) {
    KILN_CHECK(*v > 0, "{}: field 'max_new_tokens' must be positive, got {}", source, *v);
    out->max_new_tokens = *v;
  }
  if (const auto v = f.opt_integer("max_length")) {
    KILN_CHECK(*v > 0, "{}: field 'max_length' must be positive, got {}", source, *v);
    out->max_length = *v;
  }
  if (const auto v = f.opt_integer("min_new_tokens")) {
    KILN_CHECK(*v >= 0, "{}: field 'min_new_tokens' must be >= 0, got {}", source, *v);
    out->min_new_tokens = *v;
  }
  if (const auto v = f.opt_integer("num_beams")) {
    KILN_CHECK(*v > 0 && *v <= kMaxBeamsSetting, "{}: field 'num_beams' must be in 1..{}, got {}",
               source, kMaxBeamsSetting, *v);
    out->num_beams = static_cast<int>(*v);
  }
  if (const auto v = f.opt_number("length_penalty")) out->length_penalty = *v;
  if (const json* v = f.find("early_stopping")) {
    if (v->is_string() && v->get<std::string>() == "never") {
      out->early_stopping = EarlyStoppingSetting::kNever;
    } else {
      if (!v->is_boolean()) f.fail_type("early_stopping", "true, false or \"never\"", *v);
      out->early_stopping =
          v->get<bool>() ? EarlyStoppingSetting::kAlways : EarlyStoppingSetting::kHeuristic;
    }
  }
  if (const json* v = f.find("do_sample")) {
    if (!v->is_boolean()) f.fail_type("do_sample", "true or false", *v);
    out->do_sample = v->get<bool>();
  }
  if (const auto v = f.opt_number("temperature")) {
    KILN_CHECK(*v > 0, "{}: field 'temperature' must be positive, got {}", source, *v);
    out->temperature = static_cast<float>(*v);
  }
  if (const auto v = f.opt_integer("top_k")) {
    KILN_CHECK(*v >= 0, "{}: field 'top_k' must be >= 0, got {}", source, *v);
    out->top_k = static_cast<int>(std::min<int64_t>(*v, std::numeric_limits<int>::max()));
  }
  if (const auto v = f.opt_number("top_p")) {
    KILN_CHECK(*v > 0 && *v <= 1, "{}: field 'top_p' must be in (0, 1], got {}", source, *v);
    out->top_p = static_cast<float>(*v);
  }
  if (const json* v = f.find("eos_token_id")) out->eos_token_ids = token_ids(f, "eos_token_id", *v);
  if (const auto v = f.opt_number("repetition_penalty")) {
    KILN_CHECK(*v > 0, "{}: field 'repetition_penalty' must be positive, got {}", source, *v);
    out->repetition_penalty = *v;
  }
  auto ngram = [&](const char* key) -> std::optional<int> {
    const auto v = f.opt_integer(key);
    if (!v) return std::nullopt;
    KILN_CHECK(*v >= 0 && *v <= 1 << 20, "{}: field '{}' must be >= 0, got {}", source, key, *v);
    return static_cast<int>(*v);
  };
  if (const auto v = ngram("no_repeat_ngram_size")) out->no_repeat_ngram_size = *v;
  if (const auto v = ngram("encoder_no_repeat_ngram_size")) out->encoder_no_repeat_ngram_size = *v;
  if (const json* v = f.find("bad_words_ids")) {
    if (!v->is_array()) f.fail_type("bad_words_ids", "a list of lists of token ids", *v);
    std::vector<std::vector<int64_t>> words;
    for (const json& w : *v) {
      if (!w.is_array() || w.empty())
        f.fail_type("bad_words_ids", "a list of non-empty lists of token ids", *v);
      words.push_back(token_ids(f, "bad_words_ids", w));
    }
    out->bad_words_ids = std::move(words);
  }
  if (const json* v = f.find("suppress_tokens")) {
    if (!v->is_array()) f.fail_type("suppress_tokens", "a list of token ids", *v);
    out->suppress_tokens = token_ids(f, "suppress_tokens", *v);
  }
  if (const auto v = f.opt_integer("min_length")) {
    KILN_CHECK(*v >= 0, "{}: field 'min_length' must be >= 0, got {}", source, *v);
    out->min_length = *v;
  }
  if (const json* v = f.find("forced_bos_token_id")) {
    const std::vector<int64_t> ids = token_ids(f, "forced_bos_token_id", *v);
    KILN_CHECK(ids.size() == 1 && !v->is_array(),
               "{}: field 'forced_bos_token_id' must be one token id", source);
    out->forced_bos_token_id = ids[0];
  }
  if (const json* v = f.find("forced_eos_token_id"))
    out->forced_eos_token_ids = token_ids(f, "forced_eos_token_id", *v);
}

}  // namespace

std::string_view architecture_name(Architecture a) {
  switch (a) {
    case Architecture::kT5:
      return "t5";
    case Architecture::kBloom:
      return "bloom";
  }
  return "?";
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  const json doc = parse_json_object(json_text, source);
  const Fields f(doc, source);
  const json* type = f.find("model_type");
  KILN_CHECK(type != nullptr, "{}: missing 'model_type' (supported: {})", source,
             kSupportedModelTypes);
  KILN_CHECK(type->is_string(), "{}: field 'model_type' must be a string, got {} (supported: {})",
             source, brief_json(*type), kSupportedModelTypes);
  const std::string model_type = type->get<std::string>();

  ModelConfig config;
  if (model_type == "t5") {
    config.arch = Architecture::kT5;
    config.config = parse_t5(f);
  } else if (model_type == "bloom") {
    config.arch = Architecture::kBloom;
    config.config = parse_bloom(f);
  } else {
    KILN_FAIL("{}: unsupported model_type '{}' (supported: {})", source, model_type,
              kSupportedModelTypes);
  }
  if (const json* gen = f.find(kGenerationKey)) {
    if (!gen->is_object()) f.fail_type(kGenerationKey, "an object", *gen);
    parse_generation_object(*gen, fmt::format("{} ({})", source, kGenerationKey),
                            &config.generation, &config.unsupported_generation);
  }
  return config;
}

void parse_generation_config(const std::string& json_text, const std::string& source,
                             GenerationDefaults* out, std::vector<std::string>* unsupported) {
  parse_generation_object(parse_json_object(json_text, source), source, out, unsupported);
}

ModelConfig load_model_config(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::exists(config_path, ec)) {
    KILN_FAIL_KIND(ErrorKind::kNotFound, "model directory {} has no config.json ({} not found)",
                   dir, config_path);
  }
  ModelConfig config = parse_model_config(read_text_file(config_path), config_path);
  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen_path, ec)) {
    // As in transformers, generation_config.json replaces generation settings from elsewhere.
    config.generation = {};
    config.unsupported_generation.clear();
    parse_generation_config(read_text_file(gen_path), gen_path, &config.generation,
                            &config.unsupported_generation);
  }
  return config;
}

std::string model_config_to_json(const ModelConfig& config) {
  nlohmann::ordered_json j;
  j["model_type"] = std::string(architecture_name(config.arch));
  switch (config.arch) {
    case Architecture::kT5: {
      const T5Config& c = config.t5();
      j["vocab_size"] = c.vocab_size;
      j["d_model"] = c.d_model;
      j["d_kv"] = c.d_kv;
      j["d_ff"] = c.d_ff;
      j["num_layers"] = c.num_layers;
      j["num_decoder_layers"] = c.num_decoder_layers;
      j["num_heads"] = c.num_heads;
      j["relative_attention_num_buckets"] = c.relative_attention_num_buckets;
      j["relative_attention_max_distance"] = c.relative_attention_max_distance;
      j["layer_norm_epsilon"] = c.layer_norm_epsilon;
      // feed_forward_proj alone cannot say "gelu_new, not gated", so the explicit
      // dense_act_fn / is_gated_act (which transformers also writes) carry the exact choice.
      j["feed_forward_proj"] =
          fmt::format("{}{}", c.gated_ffn ? "gated-" : "", activation_family(c.ffn_activation));
      j["dense_act_fn"] = std::string(activation_to_hf(c.ffn_activation));
      j["is_gated_act"] = c.gated_ffn;
      j["tie_word_embeddings"] = c.tie_word_embeddings;
      j["scale_decoder_outputs"] = c.scale_decoder_outputs;
      j["pad_token_id"] = c.pad_token_id;
      j["eos_token_id"] = c.eos_token_id;
      j["decoder_start_token_id"] = c.decoder_start_token_id;
      break;
    }
    case Architecture::kBloom: {
      const BloomConfig& c = config.bloom();
      j["vocab_size"] = c.vocab_size;
      j["hidden_size"] = c.hidden_size;
      j["n_layer"] = c.n_layer;
      j["n_head"] = c.n_head;
      j["layer_norm_epsilon"] = c.layer_norm_epsilon;
      j["apply_residual_connection_post_layernorm"] = c.apply_residual_connection_post_layernorm;
      j["tie_word_embeddings"] = c.tie_word_embeddings;
      j["bos_token_id"] = c.bos_token_id;
      j["eos_token_id"] = c.eos_token_id;
      j["pad_token_id"] = c.pad_token_id;
      break;
    }
  }
  const GenerationDefaults& g = config.generation;
  nlohmann::ordered_json gen = nlohmann::ordered_json::object();
  if (g.max_new_tokens) gen["max_new_tokens"] = *g.max_new_tokens;
  if (g.max_length) gen["max_length"] = *g.max_length;
  if (g.min_new_tokens) gen["min_new_tokens"] = *g.min_new_tokens;
  if (g.num_beams) gen["num_beams"] = *g.num_beams;
  if (g.length_penalty) gen["length_penalty"] = *g.length_penalty;
  if (g.early_stopping) {
    switch (*g.early_stopping) {
      case EarlyStoppingSetting::kHeuristic:
        gen["early_stopping"] = false;
        break;
      case EarlyStoppingSetting::kAlways:
        gen["early_stopping"] = true;
        break;
      case EarlyStoppingSetting::kNever:
        gen["early_stopping"] = "never";
        break;
    }
  }
  if (g.do_sample) gen["do_sample"] = *g.do_sample;
  if (g.temperature) gen["temperature"] = *g.temperature;
  if (g.top_k) gen["top_k"] = *g.top_k;
  if (g.top_p) gen["top_p"] = *g.top_p;
  if (g.repetition_penalty) gen["repetition_penalty"] = *g.repetition_penalty;
  if (g.no_repeat_ngram_size) gen["no_repeat_ngram_size"] = *g.no_repeat_ngram_size;
  if (g.encoder_no_repeat_ngram_size)
    gen["encoder_no_repeat_ngram_size"] = *g.encoder_no_repeat_ngram_size;
  if (g.bad_words_ids) gen["bad_words_ids"] = *g.bad_words_ids;
  if (g.suppress_tokens) gen["suppress_tokens"] = *g.suppress_tokens;
  if (g.min_length) gen["min_length"] = *g.min_length;
  if (g.forced_bos_token_id) gen["forced_bos_token_id"] = *g.forced_bos_token_id;
  if (g.forced_eos_token_ids) gen["forced_eos_token_id"] = *g.forced_eos_token_ids;
  if (!g.eos_token_ids.empty()) gen["eos_token_id"] = g.eos_token_ids;
  if (!gen.empty()) j[kGenerationKey] = std::move(gen);
  return j.dump(2);
}

ModelDesc describe_model(const ModelConfig& config) {
  ModelDesc d;
  d.architecture = std::string(architecture_name(config.arch));
  switch (config.arch) {
    case Architecture::kT5: {
      const T5Config& c = config.t5();
      d.encoder_decoder = true;
      d.vocab_size = c.vocab_size;
      d.cache_layers = static_cast<int>(c.num_decoder_layers);
      d.num_heads = static_cast<int>(c.num_heads);
      d.head_dim = static_cast<int>(c.d_kv);
      d.eos_token_ids = {c.eos_token_id};
      d.pad_token_id = c.pad_token_id;
      d.decoder_start_token_id = c.decoder_start_token_id;
      d.max_positions = 512;  // T5's pretraining length; relative buckets allow longer
      break;
    }
    case Architecture::kBloom: {
      const BloomConfig& c = config.bloom();
      d.encoder_decoder = false;
      d.vocab_size = c.vocab_size;
      d.cache_layers = static_cast<int>(c.n_layer);
      d.num_heads = static_cast<int>(c.n_head);
      d.head_dim = static_cast<int>(c.hidden_size / c.n_head);
      d.eos_token_ids = {c.eos_token_id};
      d.pad_token_id = c.pad_token_id;
      d.decoder_start_token_id = c.bos_token_id;
      d.max_positions = 2048;  // BLOOM's training context
      break;
    }
  }
  d.generation = config.generation;
  if (!config.generation.eos_token_ids.empty()) d.eos_token_ids = config.generation.eos_token_ids;
  return d;
}

}  // namespace kiln
