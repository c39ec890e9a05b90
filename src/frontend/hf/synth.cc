#include "frontend/hf/synth.h"

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "io/atomic_file.h"
#include "io/hash.h"
#include "io/safetensors.h"

namespace kiln {

const std::vector<SynthPreset>& synth_presets() {
  // The public models' shapes (their config.json files). T5's vocabulary is 32128 (padded from
  // the 32100 SentencePiece pieces); BLOOM's is 250880.
  static const std::vector<SynthPreset> presets = {
      {"flan-t5-small", "t5", 512, 1024, 64, 6, 8, 8, 32128, true, false},
      {"flan-t5-base", "t5", 768, 2048, 64, 12, 12, 12, 32128, true, false},
      {"flan-t5-large", "t5", 1024, 2816, 64, 16, 24, 24, 32128, true, false},
      {"flan-t5-xl", "t5", 2048, 5120, 64, 32, 24, 24, 32128, true, false},
      {"t5-small", "t5", 512, 2048, 64, 8, 6, 6, 32128, false, true},
      {"bloom-560m", "bloom", 1024, 4096, 0, 16, 24, 0, 250880, false, true},
      {"bloom-1b1", "bloom", 1536, 6144, 0, 16, 24, 0, 250880, false, true},
      {"bloom-3b", "bloom", 2560, 10240, 0, 32, 30, 0, 250880, false, true},
      {"bloom-7b1", "bloom", 4096, 16384, 0, 32, 30, 0, 250880, false, true},
  };
  return presets;
}

const SynthPreset& find_synth_preset(const std::string& name) {
  std::string names;
  for (const SynthPreset& p : synth_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  KILN_FAIL_KIND(ErrorKind::kUsage, "unknown preset '{}' (presets: {})", name, names);
}

namespace {

// How a tensor is initialised: uniform with the given standard deviation, or a constant.
struct Init {
  float stddev = 0.0f;
  float constant = 0.0f;
};

struct Spec {
  std::string name;
  Shape shape;
  Init init;
};

Init fan_in(int64_t n) { return {static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))), 0}; }
Init ones() { return {0.0f, 1.0f}; }
Init zeros() { return {0.0f, 0.0f}; }

std::vector<Spec> t5_specs(const SynthPreset& p) {
  const int64_t d = p.hidden, inner = p.heads * p.d_kv, ff = p.d_ff;
  std::vector<Spec> s;
  // Embeddings of unit scale: the first RMSNorm rescales them anyway, and with d^-0.5 output
  // scaling (tied lm_head) logits then have unit scale too.
  s.push_back({"shared.weight", {p.vocab, d}, {1.0f, 0}});
  auto attention = [&](const std::string& pre, bool bias_table) {
    // T5 does not scale its attention scores by d_kv^-0.5; HF's T5 initialization folds that
    // scale into q instead (std (d_model * d_kv)^-0.5). Without it the scores of unit-scale q and
    // k have a standard deviation of sqrt(d_kv) = 8, every softmax is nearly one-hot, and the
    // last bits of any weight decide which key wins: a chaotic model on which no two precisions
    // (or summation orders) agree.
    s.push_back({pre + ".q.weight", {inner, d}, fan_in(d * p.d_kv)});
    for (const char* m : {"k", "v"})
      s.push_back({pre + "." + m + ".weight", {inner, d}, fan_in(d)});
    s.push_back({pre + ".o.weight", {d, inner}, fan_in(inner)});
    if (bias_table)
      s.push_back({pre + ".relative_attention_bias.weight", {32, p.heads}, {0.5f, 0}});
  };
  auto ffn = [&](const std::string& pre) {
    if (p.gated) {
      s.push_back({pre + ".wi_0.weight", {ff, d}, fan_in(d)});
      s.push_back({pre + ".wi_1.weight", {ff, d}, fan_in(d)});
    } else {
      s.push_back({pre + ".wi.weight", {ff, d}, fan_in(d)});
    }
    s.push_back({pre + ".wo.weight", {d, ff}, fan_in(ff)});
  };
  for (int64_t i = 0; i < p.layers; ++i) {
    const std::string b = "encoder.block." + std::to_string(i) + ".layer.";
    attention(b + "0.SelfAttention", i == 0);
    s.push_back({b + "0.layer_norm.weight", {d}, ones()});
    ffn(b + "1.DenseReluDense");
    s.push_back({b + "1.layer_norm.weight", {d}, ones()});
  }
  s.push_back({"encoder.final_layer_norm.weight", {d}, ones()});
  for (int64_t i = 0; i < p.decoder_layers; ++i) {
    const std::string b = "decoder.block." + std::to_string(i) + ".layer.";
    attention(b + "0.SelfAttention", i == 0);
    s.push_back({b + "0.layer_norm.weight", {d}, ones()});
    attention(b + "1.EncDecAttention", false);
    s.push_back({b + "1.layer_norm.weight", {d}, ones()});
    ffn(b + "2.DenseReluDense");
    s.push_back({b + "2.layer_norm.weight", {d}, ones()});
  }
  s.push_back({"decoder.final_layer_norm.weight", {d}, ones()});
  if (!p.tied) s.push_back({"lm_head.weight", {p.vocab, d}, fan_in(d)});
  return s;
}

std::vector<Spec> bloom_specs(const SynthPreset& p) {
  const int64_t h = p.hidden;
  std::vector<Spec> s;
  // Tied lm_head: embeddings of scale 1/sqrt(h) give logits of unit scale.
  s.push_back({"transformer.word_embeddings.weight", {p.vocab, h}, fan_in(h)});
  s.push_back({"transformer.word_embeddings_layernorm.weight", {h}, ones()});
  s.push_back({"transformer.word_embeddings_layernorm.bias", {h}, zeros()});
  for (int64_t i = 0; i < p.layers; ++i) {
    const std::string b = "transformer.h." + std::to_string(i) + ".";
    s.push_back({b + "input_layernorm.weight", {h}, ones()});
    s.push_back({b + "input_layernorm.bias", {h}, zeros()});
    s.push_back({b + "self_attention.query_key_value.weight", {3 * h, h}, fan_in(h)});
    s.push_back({b + "self_attention.query_key_value.bias", {3 * h}, {0.02f, 0}});
    s.push_back({b + "self_attention.dense.weight", {h, h}, fan_in(h)});
    s.push_back({b + "self_attention.dense.bias", {h}, {0.02f, 0}});
    s.push_back({b + "post_attention_layernorm.weight", {h}, ones()});
    s.push_back({b + "post_attention_layernorm.bias", {h}, zeros()});
    s.push_back({b + "mlp.dense_h_to_4h.weight", {4 * h, h}, fan_in(h)});
    s.push_back({b + "mlp.dense_h_to_4h.bias", {4 * h}, {0.02f, 0}});
    s.push_back({b + "mlp.dense_4h_to_h.weight", {h, 4 * h}, fan_in(4 * h)});
    s.push_back({b + "mlp.dense_4h_to_h.bias", {h}, {0.02f, 0}});
  }
  s.push_back({"transformer.ln_f.weight", {h}, ones()});
  s.push_back({"transformer.ln_f.bias", {h}, zeros()});
  return s;
}

std::vector<Spec> specs_of(const SynthPreset& p) {
  return p.family == "t5" ? t5_specs(p) : bloom_specs(p);
}

nlohmann::ordered_json t5_config(const SynthPreset& p, DType dtype) {
  nlohmann::ordered_json c;
  c["architectures"] = {"T5ForConditionalGeneration"};
  c["d_ff"] = p.d_ff;
  c["d_kv"] = p.d_kv;
  c["d_model"] = p.hidden;
  c["decoder_start_token_id"] = 0;
  c["dense_act_fn"] = p.gated ? "gelu_new" : "relu";
  c["dropout_rate"] = 0.0;
  c["dtype"] = dtype == DType::kF32 ? "float32" : dtype == DType::kF16 ? "float16" : "bfloat16";
  c["eos_token_id"] = 1;
  c["feed_forward_proj"] = p.gated ? "gated-gelu" : "relu";
  c["initializer_factor"] = 1.0;
  c["is_encoder_decoder"] = true;
  c["is_gated_act"] = p.gated;
  c["layer_norm_epsilon"] = 1e-6;
  c["model_type"] = "t5";
  c["num_decoder_layers"] = p.decoder_layers;
  c["num_heads"] = p.heads;
  c["num_layers"] = p.layers;
  c["pad_token_id"] = 0;
  c["relative_attention_max_distance"] = 128;
  c["relative_attention_num_buckets"] = 32;
  c["tie_word_embeddings"] = p.tied;
  c["use_cache"] = true;
  c["vocab_size"] = p.vocab;
  return c;
}

nlohmann::ordered_json bloom_config(const SynthPreset& p, DType dtype) {
  nlohmann::ordered_json c;
  c["apply_residual_connection_post_layernorm"] = false;
  c["architectures"] = {"BloomForCausalLM"};
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = 1;
  c["dtype"] = dtype == DType::kF32 ? "float32" : dtype == DType::kF16 ? "float16" : "bfloat16";
  c["eos_token_id"] = 2;
  c["hidden_dropout"] = 0.0;
  c["hidden_size"] = p.hidden;
  c["initializer_range"] = 0.02;
  c["layer_norm_epsilon"] = 1e-5;
  c["model_type"] = "bloom";
  c["n_head"] = p.heads;
  c["n_layer"] = p.layers;
  c["pad_token_id"] = 3;
  c["pretraining_tp"] = 1;
  c["slow_but_exact"] = false;
  c["tie_word_embeddings"] = true;
  c["use_cache"] = true;
  c["vocab_size"] = p.vocab;
  return c;
}

void write_file(const std::string& path, std::string_view bytes) {
  AtomicFileWriter out(path);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

// splitmix64: a fast, seedable generator; each tensor gets its own stream so any tensor can be
// regenerated alone and chunk boundaries do not change the values.
inline uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

int64_t synth_parameter_count(const SynthPreset& preset) {
  int64_t n = 0;
  for (const Spec& s : specs_of(preset)) n += shape_numel(s.shape);
  return n;
}

void synthesize_checkpoint(const SynthPreset& p, const std::string& dir,
                           const SynthOptions& options,
                           const std::function<void(int64_t, int64_t)>& progress) {
  KILN_CHECK_USAGE(
      options.dtype == DType::kF32 || options.dtype == DType::kF16 || options.dtype == DType::kBF16,
      "--dtype {}: synth writes fp32, fp16 or bf16 weights", dtype_name(options.dtype));
  AtomicDirWriter out(dir,
                      options.replace_existing ? AtomicDirWriter::Existing::kReplace
                                               : AtomicDirWriter::Existing::kRefuse,
                      "-o", "--force");

  const bool t5 = p.family == "t5";
  const nlohmann::ordered_json config =
      t5 ? t5_config(p, options.dtype) : bloom_config(p, options.dtype);
  write_file(out.path_of("config.json"), config.dump(2) + "\n");
  nlohmann::ordered_json gen;
  gen["_from_model_config"] = true;
  if (t5) {
    gen["decoder_start_token_id"] = 0;
    gen["eos_token_id"] = 1;
    gen["pad_token_id"] = 0;
  } else {
    gen["bos_token_id"] = 1;
    gen["eos_token_id"] = 2;
    gen["pad_token_id"] = 3;
  }
  write_file(out.path_of("generation_config.json"), gen.dump(2) + "\n");
  // The fixture model's tokenizer: its ids are all inside the larger vocabulary.
  const std::vector<std::string> files =
      t5 ? std::vector<std::string>{"spiece.model", "tokenizer.json", "tokenizer_config.json"}
         : std::vector<std::string>{"tokenizer.json", "tokenizer_config.json"};
  for (const std::string& f : files) {
    const std::string_view bytes = embedded_file(p.family + "/" + f);
    KILN_CHECK(!bytes.empty(), "this kiln was built without the {} tokenizer file {}", p.family, f);
    write_file(out.path_of(f), bytes);
  }

  std::vector<TensorSource> sources;
  for (const Spec& spec : specs_of(p)) {
    const uint64_t stream = hash64(spec.name.data(), spec.name.size(), options.seed);
    const DType dtype = options.dtype;
    const Init init = spec.init;
    sources.push_back(
        {spec.name, dtype, spec.shape,
         [stream, dtype, init](int64_t first, int64_t count, void* dst) {
           std::vector<float> values(static_cast<size_t>(count));
           // Uniform on [-a, a] has standard deviation a / sqrt(3).
           const float a = init.stddev * 1.7320508f;
           for (int64_t i = 0; i < count; ++i) {
             if (init.stddev == 0.0f) {
               values[i] = init.constant;
               continue;
             }
             uint64_t state = stream + static_cast<uint64_t>(first + i) * 0x9e3779b97f4a7c15ull;
             const uint64_t r = splitmix(state);
             const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
             values[i] = (2.0f * u - 1.0f) * a;
           }
           dtype_traits(dtype).from_float(values.data(), dst, static_cast<size_t>(count));
         }});
  }
  write_safetensors_streaming(out.path_of("model.safetensors"), sources, {{"format", "pt"}},
                              progress);
  out.commit();
}

}  // namespace kiln
