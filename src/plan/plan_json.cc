#include "plan/plan_json.h"

#include "core/status.h"

namespace kiln {

using nlohmann::json;

namespace {

std::string_view early_stopping_name(EarlyStoppingSetting e) {
  switch (e) {
    case EarlyStoppingSetting::kHeuristic:
      return "heuristic";
    case EarlyStoppingSetting::kAlways:
      return "always";
    case EarlyStoppingSetting::kNever:
      return "never";
  }
  return "?";
}

EarlyStoppingSetting parse_early_stopping(const std::string& s, const std::string& source) {
  for (EarlyStoppingSetting e : {EarlyStoppingSetting::kHeuristic, EarlyStoppingSetting::kAlways,
                                 EarlyStoppingSetting::kNever})
    if (early_stopping_name(e) == s) return e;
  KILN_FAIL("{}: unknown early_stopping '{}'", source, s);
}

template <typename T>
void put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}
template <typename T>
void get(const json& j, const char* key, std::optional<T>* out) {
  if (j.contains(key)) *out = j.at(key).get<T>();
}

}  // namespace

json desc_to_json(const ModelDesc& d) {
  json gen = json::object();
  const GenerationDefaults& g = d.generation;
  put(gen, "max_new_tokens", g.max_new_tokens);
  put(gen, "max_length", g.max_length);
  put(gen, "min_new_tokens", g.min_new_tokens);
  put(gen, "num_beams", g.num_beams);
  put(gen, "length_penalty", g.length_penalty);
  if (g.early_stopping) gen["early_stopping"] = early_stopping_name(*g.early_stopping);
  put(gen, "do_sample", g.do_sample);
  put(gen, "temperature", g.temperature);
  put(gen, "top_k", g.top_k);
  put(gen, "top_p", g.top_p);
  put(gen, "repetition_penalty", g.repetition_penalty);
  put(gen, "no_repeat_ngram_size", g.no_repeat_ngram_size);
  put(gen, "encoder_no_repeat_ngram_size", g.encoder_no_repeat_ngram_size);
  put(gen, "bad_words_ids", g.bad_words_ids);
  put(gen, "suppress_tokens", g.suppress_tokens);
  put(gen, "min_length", g.min_length);
  put(gen, "forced_bos_token_id", g.forced_bos_token_id);
  put(gen, "forced_eos_token_ids", g.forced_eos_token_ids);
  if (!g.eos_token_ids.empty()) gen["eos_token_ids"] = g.eos_token_ids;
  return json{{"architecture", d.architecture},
              {"encoder_decoder", d.encoder_decoder},
              {"vocab_size", d.vocab_size},
              {"cache_layers", d.cache_layers},
              {"num_heads", d.num_heads},
              {"head_dim", d.head_dim},
              {"eos_token_ids", d.eos_token_ids},
              {"pad_token_id", d.pad_token_id},
              {"decoder_start_token_id", d.decoder_start_token_id},
              {"max_positions", d.max_positions},
              {"generation", gen}};
}

ModelDesc desc_from_json(const json& j, const std::string& source) {
  ModelDesc d;
  d.architecture = j.at("architecture").get<std::string>();
  d.encoder_decoder = j.at("encoder_decoder").get<bool>();
  d.vocab_size = j.at("vocab_size").get<int64_t>();
  d.cache_layers = j.at("cache_layers").get<int>();
  d.num_heads = j.at("num_heads").get<int>();
  d.head_dim = j.at("head_dim").get<int>();
  d.eos_token_ids = j.at("eos_token_ids").get<std::vector<int64_t>>();
  d.pad_token_id = j.at("pad_token_id").get<int64_t>();
  d.decoder_start_token_id = j.at("decoder_start_token_id").get<int64_t>();
  d.max_positions = j.at("max_positions").get<int64_t>();
  const json& gen = j.at("generation");
  GenerationDefaults& g = d.generation;
  get(gen, "max_new_tokens", &g.max_new_tokens);
  get(gen, "max_length", &g.max_length);
  get(gen, "min_new_tokens", &g.min_new_tokens);
  get(gen, "num_beams", &g.num_beams);
  get(gen, "length_penalty", &g.length_penalty);
  if (gen.contains("early_stopping"))
    g.early_stopping = parse_early_stopping(gen.at("early_stopping").get<std::string>(), source);
  get(gen, "do_sample", &g.do_sample);
  get(gen, "temperature", &g.temperature);
  get(gen, "top_k", &g.top_k);
  get(gen, "top_p", &g.top_p);
  get(gen, "repetition_penalty", &g.repetition_penalty);
  get(gen, "no_repeat_ngram_size", &g.no_repeat_ngram_size);
  get(gen, "encoder_no_repeat_ngram_size", &g.encoder_no_repeat_ngram_size);
  get(gen, "bad_words_ids", &g.bad_words_ids);
  get(gen, "suppress_tokens", &g.suppress_tokens);
  get(gen, "min_length", &g.min_length);
  get(gen, "forced_bos_token_id", &g.forced_bos_token_id);
  get(gen, "forced_eos_token_ids", &g.forced_eos_token_ids);
  if (gen.contains("eos_token_ids"))
    g.eos_token_ids = gen.at("eos_token_ids").get<std::vector<int64_t>>();
  check_model_desc(d, source);
  // The stored defaults must be valid generation parameters.
  const int beams = g.num_beams.value_or(1);
  const float top_p = g.top_p.value_or(1.0f);
  KILN_CHECK(beams >= 1 && beams <= kMaxBeamsSetting && g.max_new_tokens.value_or(1) > 0 &&
                 top_p > 0 && top_p <= 1 && g.temperature.value_or(1.0f) > 0,
             "{}: invalid generation defaults", source);
  KILN_CHECK(g.repetition_penalty.value_or(1.0) > 0 && g.no_repeat_ngram_size.value_or(0) >= 0 &&
                 g.encoder_no_repeat_ngram_size.value_or(0) >= 0 && g.min_length.value_or(0) >= 0,
             "{}: invalid generation defaults (a non-positive penalty or a negative size)", source);
  return d;
}

json profile_to_json(const ShapeProfile& p) {
  return json{{"max_input_tokens", p.max_input_tokens},
              {"max_step_tokens", p.max_step_tokens},
              {"max_batch", p.max_batch},
              {"token_buckets", p.token_buckets}};
}

ShapeProfile profile_from_json(const json& j, const std::string& source) {
  ShapeProfile p;
  p.max_input_tokens = j.at("max_input_tokens").get<int64_t>();
  p.max_step_tokens = j.at("max_step_tokens").get<int64_t>();
  p.max_batch = j.at("max_batch").get<int64_t>();
  p.token_buckets = j.at("token_buckets").get<std::vector<int64_t>>();
  check_shape_profile(p, source);
  return p;
}

json layout_to_json(const WeightLayout& l) {
  if (l.plain()) return json{{"kind", "plain"}};
  return json{{"kind", "packed"}, {"packing", l.packing}, {"target", l.target}};
}

WeightLayout layout_from_json(const json& j, const std::string& source) {
  const std::string kind = j.at("kind").get<std::string>();
  if (kind == "plain") return {};
  KILN_CHECK(kind == "packed", "{}: unknown weight layout '{}'", source, kind);
  return WeightLayout{j.at("packing").get<std::string>(), j.at("target").get<std::string>()};
}

}  // namespace kiln
