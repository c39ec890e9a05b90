// config.json / generation_config.json parsing. Expected values are the fixture files' own
// fields and transformers' documented defaults (T5Config, BloomConfig, GenerationConfig).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>

#include "core/status.h"
#include "frontend/hf/hf_config.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kFixtures = KILN_FIXTURES_DIR;

std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(KILN_TEST_TMP) / "io_hf_config" /
                       (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts,
                  ErrorKind kind = ErrorKind::kRuntime) {
  try {
    fn();
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    return;
  }
  ADD_FAILURE() << "expected a kiln::Error";
}

void expect_parse_error(const std::string& json, const std::vector<std::string>& parts) {
  std::vector<std::string> all = parts;
  all.push_back("test/config.json");
  expect_error([&] { parse_model_config(json, "test/config.json"); }, all);
}

T5Config t5(const std::string& json) {
  const ModelConfig c = parse_model_config(json, "t5.json");
  EXPECT_EQ(c.arch, Architecture::kT5);
  return c.t5();
}

BloomConfig bloom(const std::string& json) {
  const ModelConfig c = parse_model_config(json, "bloom.json");
  EXPECT_EQ(c.arch, Architecture::kBloom);
  return c.bloom();
}

TEST(HfConfig, T5FixtureEveryField) {
  const ModelConfig config = load_model_config(kFixtures + "/t5-tiny");
  ASSERT_EQ(config.arch, Architecture::kT5);
  const T5Config& c = config.t5();
  EXPECT_EQ(c.vocab_size, 288);
  EXPECT_EQ(c.d_model, 192);
  EXPECT_EQ(c.d_kv, 32);
  EXPECT_EQ(c.d_ff, 512);
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.num_decoder_layers, 4);
  EXPECT_EQ(c.num_heads, 6);
  EXPECT_EQ(c.relative_attention_num_buckets, 32);
  EXPECT_EQ(c.relative_attention_max_distance, 128);
  EXPECT_EQ(c.layer_norm_epsilon, 1e-6);
  EXPECT_TRUE(c.gated_ffn);
  EXPECT_EQ(c.ffn_activation, Activation::kGeluTanh);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.scale_decoder_outputs);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.decoder_start_token_id, 0);
  // generation_config.json sets only eos among the generation fields.
  EXPECT_FALSE(config.generation.max_new_tokens);
  EXPECT_FALSE(config.generation.num_beams);
  EXPECT_FALSE(config.generation.length_penalty);
  EXPECT_FALSE(config.generation.early_stopping);
  EXPECT_EQ(config.generation.eos_token_ids, std::vector<int64_t>{1});
}

TEST(HfConfig, BloomFixtureEveryField) {
  const ModelConfig config = load_model_config(kFixtures + "/bloom-tiny");
  ASSERT_EQ(config.arch, Architecture::kBloom);
  const BloomConfig& c = config.bloom();
  EXPECT_EQ(c.vocab_size, 448);
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.n_layer, 6);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.layer_norm_epsilon, 1e-5);
  EXPECT_FALSE(c.apply_residual_connection_post_layernorm);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.pad_token_id, 3);
  EXPECT_FALSE(config.generation.max_new_tokens);
  EXPECT_FALSE(config.generation.num_beams);
  EXPECT_EQ(config.generation.eos_token_ids, std::vector<int64_t>{2});
}

TEST(HfConfig, T5DefaultsWhenKeysAbsent) {
  const T5Config c = t5(R"({"model_type": "t5"})");
  EXPECT_EQ(c.vocab_size, 32128);
  EXPECT_EQ(c.d_model, 512);
  EXPECT_EQ(c.d_kv, 64);
  EXPECT_EQ(c.d_ff, 2048);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.num_decoder_layers, 6);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.relative_attention_num_buckets, 32);
  EXPECT_EQ(c.relative_attention_max_distance, 128);
  EXPECT_EQ(c.layer_norm_epsilon, 1e-6);
  EXPECT_FALSE(c.gated_ffn);  // feed_forward_proj defaults to "relu"
  EXPECT_EQ(c.ffn_activation, Activation::kRelu);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.scale_decoder_outputs);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.decoder_start_token_id, 0);
}

TEST(HfConfig, T5DecoderLayersDefaultToNumLayers) {
  EXPECT_EQ(t5(R"({"model_type": "t5", "num_layers": 3})").num_decoder_layers, 3);
  EXPECT_EQ(
      t5(R"({"model_type": "t5", "num_layers": 3, "num_decoder_layers": null})").num_decoder_layers,
      3);
  EXPECT_EQ(
      t5(R"({"model_type": "t5", "num_layers": 3, "num_decoder_layers": 5})").num_decoder_layers,
      5);
}

TEST(HfConfig, T5FeedForwardProj) {
  struct Case {
    const char* proj;
    bool gated;
    Activation act;
  };
  // As transformers' T5Config: only "gated-gelu" is rewritten to gelu_new; plain "gelu" is
  // ACT2FN["gelu"], the exact erf GELU.
  const Case cases[] = {{"relu", false, Activation::kRelu},
                        {"gated-gelu", true, Activation::kGeluTanh},
                        {"gated-silu", true, Activation::kSilu},
                        {"gated-relu", true, Activation::kRelu},
                        {"gelu", false, Activation::kGeluExact},
                        {"gelu_new", false, Activation::kGeluTanh},
                        {"gated-gelu_new", true, Activation::kGeluTanh},
                        {"silu", false, Activation::kSilu}};
  for (const Case& k : cases) {
    const T5Config c =
        t5(fmt::format(R"({{"model_type": "t5", "feed_forward_proj": "{}"}})", k.proj));
    EXPECT_EQ(c.gated_ffn, k.gated) << k.proj;
    EXPECT_EQ(c.ffn_activation, k.act) << k.proj;
  }
}

TEST(HfConfig, T5DenseActFnAndIsGatedActOverride) {
  const std::string base = R"({"model_type": "t5", "feed_forward_proj": "gated-gelu", )";
  EXPECT_EQ(t5(base + R"("dense_act_fn": "gelu"})").ffn_activation, Activation::kGeluExact);
  EXPECT_EQ(t5(base + R"("dense_act_fn": "gelu_new"})").ffn_activation, Activation::kGeluTanh);
  EXPECT_EQ(t5(base + R"("dense_act_fn": "gelu_pytorch_tanh"})").ffn_activation,
            Activation::kGeluTanh);
  EXPECT_EQ(t5(base + R"("dense_act_fn": "relu"})").ffn_activation, Activation::kRelu);
  EXPECT_EQ(t5(base + R"("dense_act_fn": "silu"})").ffn_activation, Activation::kSilu);
  EXPECT_FALSE(t5(base + R"("is_gated_act": false})").gated_ffn);
  EXPECT_TRUE(
      t5(R"({"model_type": "t5", "feed_forward_proj": "relu", "is_gated_act": true})").gated_ffn);
}

TEST(HfConfig, ScaleDecoderOutputsRule) {
  // Absent: follows tie_word_embeddings.
  EXPECT_TRUE(t5(R"({"model_type": "t5", "tie_word_embeddings": true})").scale_decoder_outputs);
  EXPECT_FALSE(t5(R"({"model_type": "t5", "tie_word_embeddings": false})").scale_decoder_outputs);
  // Present: the key wins either way.
  EXPECT_FALSE(t5(R"({"model_type": "t5", "tie_word_embeddings": true,
                      "scale_decoder_outputs": false})")
                   .scale_decoder_outputs);
  const T5Config c = t5(R"({"model_type": "t5", "tie_word_embeddings": false,
                            "scale_decoder_outputs": true})");
  EXPECT_TRUE(c.scale_decoder_outputs);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(HfConfig, BloomDefaultsAndAliases) {
  const BloomConfig d = bloom(R"({"model_type": "bloom"})");
  EXPECT_EQ(d.vocab_size, 250880);
  EXPECT_EQ(d.hidden_size, 64);
  EXPECT_EQ(d.n_layer, 2);
  EXPECT_EQ(d.n_head, 8);
  EXPECT_EQ(d.layer_norm_epsilon, 1e-5);
  EXPECT_FALSE(d.apply_residual_connection_post_layernorm);
  EXPECT_TRUE(d.tie_word_embeddings);
  EXPECT_EQ(d.bos_token_id, 1);
  EXPECT_EQ(d.eos_token_id, 2);
  EXPECT_EQ(d.pad_token_id, 3);

  const BloomConfig a = bloom(R"({"model_type": "bloom", "n_embed": 1024,
      "num_hidden_layers": 24, "num_attention_heads": 16,
      "apply_residual_connection_post_layernorm": true, "tie_word_embeddings": false})");
  EXPECT_EQ(a.hidden_size, 1024);
  EXPECT_EQ(a.n_layer, 24);
  EXPECT_EQ(a.n_head, 16);
  EXPECT_TRUE(a.apply_residual_connection_post_layernorm);
  EXPECT_FALSE(a.tie_word_embeddings);
  // Both spellings present and equal is fine.
  EXPECT_EQ(bloom(R"({"model_type": "bloom", "n_head": 4, "num_attention_heads": 4})").n_head, 4);
}

TEST(HfConfig, GenerationConfigFields) {
  GenerationDefaults g;
  parse_generation_config(R"({"max_new_tokens": 32, "num_beams": 4, "length_penalty": 0.6,
                              "early_stopping": true, "eos_token_id": [1, 7]})",
                          "gen.json", &g);
  EXPECT_EQ(g.max_new_tokens, 32);
  EXPECT_EQ(g.num_beams, 4);
  EXPECT_EQ(g.length_penalty, 0.6);
  EXPECT_EQ(g.early_stopping, EarlyStoppingSetting::kAlways);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{1, 7}));

  GenerationDefaults h;
  parse_generation_config(R"({"early_stopping": "never", "eos_token_id": 2, "length_penalty": 1,
                              "max_new_tokens": null})",
                          "gen.json", &h);
  EXPECT_EQ(h.early_stopping, EarlyStoppingSetting::kNever);
  EXPECT_EQ(h.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(h.length_penalty, 1.0);
  EXPECT_FALSE(h.max_new_tokens);

  GenerationDefaults e;
  parse_generation_config(R"({"early_stopping": false})", "gen.json", &e);
  EXPECT_EQ(e.early_stopping, EarlyStoppingSetting::kHeuristic);
  EXPECT_TRUE(e.eos_token_ids.empty());
}

TEST(HfConfig, LoadWithoutGenerationConfig) {
  const std::string dir = test_dir();
  write_file(dir + "/config.json", R"({"model_type": "bloom", "hidden_size": 32, "n_head": 4})");
  const ModelConfig c = load_model_config(dir);
  EXPECT_EQ(c.bloom().hidden_size, 32);
  EXPECT_EQ(c.generation, GenerationDefaults{});
}

TEST(HfConfig, RoundTripsThroughJson) {
  std::vector<ModelConfig> configs = {load_model_config(kFixtures + "/t5-tiny"),
                                      load_model_config(kFixtures + "/bloom-tiny")};
  for (bool gated : {false, true}) {
    for (Activation act :
         {Activation::kRelu, Activation::kGeluTanh, Activation::kGeluExact, Activation::kSilu}) {
      for (bool scale : {false, true}) {
        T5Config c;
        c.gated_ffn = gated;
        c.ffn_activation = act;
        c.scale_decoder_outputs = scale;
        c.tie_word_embeddings = !scale;
        c.num_decoder_layers = 3;
        c.layer_norm_epsilon = 1.234567890123e-7;
        c.decoder_start_token_id = 5;
        configs.push_back({Architecture::kT5, c, {}});
      }
    }
  }
  BloomConfig b;
  b.apply_residual_connection_post_layernorm = true;
  b.tie_word_embeddings = false;
  b.layer_norm_epsilon = 0.1;
  auto gen = [](std::optional<int64_t> max_new, std::optional<int> beams,
                std::optional<double> penalty, EarlyStoppingSetting stop,
                std::vector<int64_t> eos) {
    GenerationDefaults g;
    g.max_new_tokens = max_new;
    g.num_beams = beams;
    g.length_penalty = penalty;
    g.early_stopping = stop;
    g.eos_token_ids = std::move(eos);
    return g;
  };
  configs.push_back(
      {Architecture::kBloom, b, gen(64, 4, 0.7, EarlyStoppingSetting::kHeuristic, {2, 9})});
  configs.push_back(
      {Architecture::kBloom, b, gen(std::nullopt, 1, {}, EarlyStoppingSetting::kAlways, {})});
  configs.push_back({Architecture::kBloom, b, gen(8, 2, -0.5, EarlyStoppingSetting::kNever, {})});
  GenerationDefaults sampling;
  sampling.do_sample = true;
  sampling.temperature = 0.5f;
  sampling.top_k = 7;
  sampling.top_p = 0.75f;
  sampling.max_length = 30;
  sampling.min_new_tokens = 2;
  configs.push_back({Architecture::kBloom, b, sampling});

  for (const ModelConfig& c : configs) {
    const std::string json = model_config_to_json(c);
    const ModelConfig back = parse_model_config(json, "roundtrip.json");
    EXPECT_EQ(back, c) << json;
    EXPECT_EQ(model_config_to_json(back), json);
  }
}

// Plans store the config in HF's spelling, so that HF tooling reads the same three values.
TEST(HfConfig, EarlyStoppingWrittenInHfSpelling) {
  const std::pair<EarlyStoppingSetting, std::string> cases[] = {
      {EarlyStoppingSetting::kHeuristic, R"("early_stopping": false)"},
      {EarlyStoppingSetting::kAlways, R"("early_stopping": true)"},
      {EarlyStoppingSetting::kNever, R"("early_stopping": "never")"}};
  for (const auto& [value, spelling] : cases) {
    GenerationDefaults g;
    g.early_stopping = value;
    const std::string json = model_config_to_json({Architecture::kBloom, BloomConfig{}, g});
    EXPECT_NE(json.find(spelling), std::string::npos) << json;
  }
}

TEST(HfConfig, Names) {
  EXPECT_EQ(activation_name(Activation::kRelu), "relu");
  EXPECT_EQ(activation_name(Activation::kGeluTanh), "gelu_tanh");
  EXPECT_EQ(activation_name(Activation::kGeluExact), "gelu_exact");
  EXPECT_EQ(activation_name(Activation::kSilu), "silu");
  EXPECT_EQ(architecture_name(Architecture::kT5), "t5");
  EXPECT_EQ(architecture_name(Architecture::kBloom), "bloom");
}

TEST(BadInputHfConfig, MissingConfig) {
  const std::string dir = test_dir();
  expect_error([&] { load_model_config(dir); }, {dir + "/config.json"}, ErrorKind::kNotFound);
}

TEST(BadInputHfConfig, MalformedJson) {
  expect_parse_error(R"({"model_type": "t5", )", {"invalid JSON"});
  expect_parse_error("[]", {"JSON object"});
  const std::string dir = test_dir();
  write_file(dir + "/config.json", "{\"model_type\": ");
  expect_error([&] { load_model_config(dir); }, {dir + "/config.json", "invalid JSON"});
}

TEST(BadInputHfConfig, MalformedGenerationConfig) {
  const std::string dir = test_dir();
  write_file(dir + "/config.json", R"({"model_type": "t5"})");
  write_file(dir + "/generation_config.json", R"({"num_beams": )");
  expect_error([&] { load_model_config(dir); }, {dir + "/generation_config.json", "invalid JSON"});
  write_file(dir + "/generation_config.json", R"({"num_beams": "4"})");
  expect_error([&] { load_model_config(dir); },
               {dir + "/generation_config.json", "'num_beams'", "integer"});
}

TEST(BadInputHfConfig, WrongFieldType) {
  expect_parse_error(R"({"model_type": "t5", "d_model": "abc"})", {"'d_model'", "integer", "abc"});
  expect_parse_error(R"({"model_type": "t5", "num_heads": 8.5})", {"'num_heads'", "integer"});
  expect_parse_error(R"({"model_type": "t5", "tie_word_embeddings": "yes"})",
                     {"'tie_word_embeddings'", "true or false"});
  expect_parse_error(R"({"model_type": "t5", "layer_norm_epsilon": [1]})",
                     {"'layer_norm_epsilon'", "number"});
  expect_parse_error(R"({"model_type": "t5", "feed_forward_proj": 3})",
                     {"'feed_forward_proj'", "string"});
  expect_parse_error(R"({"model_type": "bloom", "n_head": true})", {"'n_head'", "integer"});
  expect_parse_error(R"({"model_type": "bloom", "eos_token_id": "2"})", {"'eos_token_id'"});
  expect_parse_error(R"({"model_type": 5})", {"'model_type'", "t5", "bloom"});
}

TEST(BadInputHfConfig, HugeOrDeepValuesGiveShortMessages) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  try {
    parse_model_config(R"({"model_type": "t5", "d_model": )" + deep + "}", "c.json");
    ADD_FAILURE() << "expected a kiln::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'d_model'"));
    EXPECT_LT(std::string(e.what()).size(), 300u);
  }
  const std::string big = "\"" + std::string(1 << 20, 'a') + "\"";
  try {
    parse_model_config(R"({"model_type": "t5", "d_model": )" + big + "}", "c.json");
    ADD_FAILURE() << "expected a kiln::Error";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u);
  }
}

TEST(BadInputHfConfig, NonPositiveSizes) {
  expect_parse_error(R"({"model_type": "t5", "d_model": 0})", {"'d_model'", "positive"});
  expect_parse_error(R"({"model_type": "t5", "num_heads": -2})", {"'num_heads'", "positive"});
  expect_parse_error(R"({"model_type": "t5", "layer_norm_epsilon": 0})",
                     {"'layer_norm_epsilon'", "positive"});
  expect_parse_error(R"({"model_type": "bloom", "n_layer": 0})", {"'n_layer'", "positive"});
  expect_parse_error(R"({"model_type": "t5", "vocab_size": 18446744073709551615})",
                     {"'vocab_size'", "out of range"});
}

TEST(BadInputHfConfig, BloomHiddenNotDivisibleByHeads) {
  expect_parse_error(R"({"model_type": "bloom", "hidden_size": 100, "n_head": 8})",
                     {"'hidden_size'", "100", "'n_head'", "8", "divisible"});
}

TEST(BadInputHfConfig, BloomConflictingAliases) {
  expect_parse_error(R"({"model_type": "bloom", "hidden_size": 64, "n_embed": 128})",
                     {"'hidden_size'", "'n_embed'", "disagree"});
}

TEST(BadInputHfConfig, UnknownModelType) {
  expect_parse_error(R"({"model_type": "llama", "hidden_size": 64})",
                     {"llama", "supported", "t5", "bloom"});
  expect_parse_error(R"({"model_type": "mt5"})", {"mt5"});
}

TEST(BadInputHfConfig, MissingModelType) {
  expect_parse_error(R"({"d_model": 512})", {"model_type", "t5", "bloom"});
}

TEST(BadInputHfConfig, BadActivation) {
  expect_parse_error(R"({"model_type": "t5", "feed_forward_proj": "gated-foo"})",
                     {"'feed_forward_proj'", "foo"});
  expect_parse_error(R"({"model_type": "t5", "feed_forward_proj": "gated-gelu-x"})",
                     {"'feed_forward_proj'", "gated-gelu-x"});
  expect_parse_error(R"({"model_type": "t5", "feed_forward_proj": "relu-gated"})",
                     {"'feed_forward_proj'", "relu-gated"});
  expect_parse_error(R"({"model_type": "t5", "dense_act_fn": "quick_gelu"})",
                     {"'dense_act_fn'", "quick_gelu"});
}

TEST(BadInputHfConfig, BadGenerationValues) {
  GenerationDefaults g;
  expect_error([&] { parse_generation_config(R"({"num_beams": 0})", "g.json", &g); },
               {"g.json", "'num_beams'", "1..32"});
  expect_error([&] { parse_generation_config(R"({"num_beams": 33})", "g.json", &g); },
               {"g.json", "'num_beams'", "1..32"});
  expect_error([&] { parse_generation_config(R"({"top_p": 1.5})", "g.json", &g); },
               {"g.json", "'top_p'"});
  expect_error([&] { parse_generation_config(R"({"temperature": 0})", "g.json", &g); },
               {"g.json", "'temperature'"});
  expect_error([&] { parse_generation_config(R"({"do_sample": "yes"})", "g.json", &g); },
               {"g.json", "'do_sample'"});
  expect_error([&] { parse_generation_config(R"({"max_new_tokens": -1})", "g.json", &g); },
               {"g.json", "'max_new_tokens'"});
  expect_error([&] { parse_generation_config(R"({"early_stopping": "sometimes"})", "g.json", &g); },
               {"g.json", "'early_stopping'", "sometimes"});
  expect_error([&] { parse_generation_config(R"({"eos_token_id": [1, "2"]})", "g.json", &g); },
               {"g.json", "'eos_token_id'"});
  expect_error([&] { parse_generation_config(R"({"length_penalty": "1"})", "g.json", &g); },
               {"g.json", "'length_penalty'"});
  expect_error([&] { parse_generation_config("[1]", "g.json", &g); }, {"g.json", "object"});
  expect_parse_error(R"({"model_type": "t5", "generation_config": 3})", {"generation_config"});
}

}  // namespace
}  // namespace kiln
