#include "graph/model_ir.h"

#include <algorithm>
#include <span>

namespace kiln {

void check_model_desc(const ModelDesc& d, const std::string& source) {
  KILN_CHECK(d.vocab_size > 0 && d.cache_layers > 0 && d.num_heads > 0 && d.head_dim > 0 &&
                 d.max_positions > 0,
             "{}: invalid model description (vocabulary {}, {} cache layers, {} heads of {}, "
             "{} positions): each must be positive",
             source, d.vocab_size, d.cache_layers, d.num_heads, d.head_dim, d.max_positions);
  KILN_CHECK(!d.eos_token_ids.empty(), "{}: the model has no end-of-sequence id", source);
  auto in_vocab = [&](int64_t id) { return id >= 0 && id < d.vocab_size; };
  for (int64_t id : d.eos_token_ids)
    KILN_CHECK(in_vocab(id), "{}: eos id {} is outside the vocabulary of {}", source, id,
               d.vocab_size);
  KILN_CHECK(in_vocab(d.pad_token_id), "{}: pad id {} is outside the vocabulary of {}", source,
             d.pad_token_id, d.vocab_size);
  KILN_CHECK(!d.encoder_decoder || in_vocab(d.decoder_start_token_id),
             "{}: decoder start id {} is outside the vocabulary of {}", source,
             d.decoder_start_token_id, d.vocab_size);
  const GenerationDefaults& g = d.generation;
  for (int64_t id : g.eos_token_ids)
    KILN_CHECK(in_vocab(id), "{}: generation eos id {} is outside the vocabulary of {}", source, id,
               d.vocab_size);
  auto check_ids = [&](const char* field, std::span<const int64_t> ids) {
    for (int64_t id : ids)
      KILN_CHECK(in_vocab(id),
                 "{}: generation setting '{}' holds token id {}, outside the "
                 "vocabulary of {}",
                 source, field, id, d.vocab_size);
  };
  if (g.suppress_tokens) check_ids("suppress_tokens", *g.suppress_tokens);
  if (g.forced_eos_token_ids) check_ids("forced_eos_token_id", *g.forced_eos_token_ids);
  if (g.forced_bos_token_id)
    check_ids("forced_bos_token_id", std::span(&*g.forced_bos_token_id, 1));
  if (g.bad_words_ids)
    for (const std::vector<int64_t>& words : *g.bad_words_ids) {
      KILN_CHECK(!words.empty(), "{}: generation setting 'bad_words_ids' holds an empty list",
                 source);
      check_ids("bad_words_ids", words);
    }
}

int64_t ShapeProfile::bucket_for(int64_t tokens) const {
  for (int64_t b : token_buckets)
    if (tokens <= b) return b;
  KILN_FAIL("a step of {} tokens exceeds the plan's limit of {} tokens per step", tokens,
            max_step_tokens);
}

std::vector<int64_t> ShapeProfile::default_buckets(int64_t max_step_tokens) {
  std::vector<int64_t> out;
  for (int64_t b = 16; b < max_step_tokens; b *= 4) out.push_back(b);
  out.push_back(max_step_tokens);
  return out;
}

std::map<std::string, int64_t> ShapeProfile::bucket_bindings(int64_t bucket) const {
  return {{"tokens", bucket}, {"rows", std::min(bucket, max_batch)}};
}

void check_shape_profile(const ShapeProfile& p, const std::string& source) {
  KILN_CHECK(p.max_input_tokens > 0 && p.max_step_tokens > 0 && p.max_batch > 0,
             "{}: invalid shape profile (max input tokens {}, max step tokens {}, max batch {}): "
             "each must be positive",
             source, p.max_input_tokens, p.max_step_tokens, p.max_batch);
  KILN_CHECK(!p.token_buckets.empty() && p.token_buckets.back() == p.max_step_tokens,
             "{}: token buckets must end at max_step_tokens {}", source, p.max_step_tokens);
  for (size_t i = 0; i < p.token_buckets.size(); ++i)
    KILN_CHECK(p.token_buckets[i] > 0 && (i == 0 || p.token_buckets[i] > p.token_buckets[i - 1]),
               "{}: token buckets must be positive and ascending", source);
}

bool ModelIR::has_graph(const std::string& name) const {
  return std::any_of(graphs.begin(), graphs.end(), [&](const Graph& g) { return g.name == name; });
}

const Graph& ModelIR::graph(const std::string& name) const {
  for (const Graph& g : graphs)
    if (g.name == name) return g;
  KILN_FAIL("model has no graph named '{}'", name);
}

Graph& ModelIR::graph(const std::string& name) {
  return const_cast<Graph&>(static_cast<const ModelIR*>(this)->graph(name));
}

namespace {

void expect_io(const Graph& g, bool input, const std::string& name, DType dtype, size_t rank,
               const std::string& source) {
  const std::vector<int>& ids = input ? g.inputs : g.outputs;
  for (int id : ids) {
    const Value& v = g.values[id];
    if (v.name != name) continue;
    KILN_CHECK(v.dtype == dtype && v.shape.size() == rank,
               "{}: graph '{}' {} '{}' is {} {}, expected {} of rank {}", source, g.name,
               input ? "input" : "output", name, dtype_name(v.dtype), sym_shape_str(v.shape),
               dtype_name(dtype), rank);
    return;
  }
  KILN_FAIL("{}: graph '{}' has no {} named '{}'", source, g.name, input ? "input" : "output",
            name);
}

}  // namespace

void check_model_contract(const ModelIR& model, const std::string& source) {
  check_model_desc(model.desc, source);
  check_shape_profile(model.profile, source);
  KILN_CHECK(model.has_graph(kDecoderGraph), "{}: no decoder graph", source);
  const Graph& dec = model.graph(kDecoderGraph);
  expect_io(dec, true, "input_ids", DType::kI64, 1, source);
  expect_io(dec, true, "logit_rows", DType::kI64, 1, source);
  expect_io(dec, false, "logits", DType::kF32, 2, source);
  const Value& logits = dec.values[dec.output("logits")];
  KILN_CHECK(logits.shape[1] == Dim::of(model.desc.vocab_size),
             "{}: logits are {} wide, the model's vocabulary is {}", source,
             sym_shape_str(logits.shape), model.desc.vocab_size);
  const int layers = model.desc.cache_layers;
  const int64_t width = model.desc.cache_row_width();
  for (const Graph& g : model.graphs) {
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kAttention) continue;
      const AttentionAttrs& a = n.attr<AttentionAttrs>();
      if (a.kind == AttentionKind::kEncoderSelf) continue;
      KILN_CHECK(a.layer >= 0 && a.layer < layers,
                 "{}: attention '{}' binds cache layer {}, the model has {}", source, n.name,
                 a.layer, layers);
      KILN_CHECK(static_cast<int64_t>(a.num_heads) * a.head_dim == width,
                 "{}: attention '{}' is {}x{} wide, the cache rows are {}", source, n.name,
                 a.num_heads, a.head_dim, width);
    }
  }
  if (model.desc.encoder_decoder) {
    KILN_CHECK(model.has_graph(kEncoderGraph), "{}: encoder-decoder model without encoder graph",
               source);
    const Graph& enc = model.graph(kEncoderGraph);
    expect_io(enc, true, "input_ids", DType::kI64, 1, source);
    // Cross K/V are in the plan's activation type (f32, or f16/bf16 for reduced precision).
    const int first_cross = enc.find_value("cross_k.0");
    const DType cross_type = first_cross >= 0 ? enc.values[first_cross].dtype : DType::kF32;
    KILN_CHECK(cross_type == DType::kF32 || cross_type == DType::kF16 || cross_type == DType::kBF16,
               "{}: cross K/V are {}, expected f32, f16 or bf16", source, dtype_name(cross_type));
    for (int l = 0; l < layers; ++l) {
      expect_io(enc, false, "cross_k." + std::to_string(l), cross_type, 2, source);
      expect_io(enc, false, "cross_v." + std::to_string(l), cross_type, 2, source);
      const Value& k = enc.values[enc.output("cross_k." + std::to_string(l))];
      KILN_CHECK(k.shape[1] == Dim::of(width), "{}: cross_k.{} is {}, expected rows of {}", source,
                 l, sym_shape_str(k.shape), width);
    }
  }
}

void check_prompt_template(const std::string& templ) {
  KILN_CHECK_USAGE(templ.find("{prompt}") != std::string::npos,
                   "prompt template '{}' must contain {{prompt}} (where the prompt goes)", templ);
}

std::string apply_prompt_template(const std::string& templ, const std::string& prompt) {
  static constexpr std::string_view kMarker = "{prompt}";
  std::string out;
  size_t from = 0;
  for (size_t pos; (pos = templ.find(kMarker, from)) != std::string::npos;
       from = pos + kMarker.size())
    out.append(templ, from, pos - from).append(prompt);
  out.append(templ, from, std::string::npos);
  return out;
}

}  // namespace kiln
