#include "graph/model_ir.h"

namespace kiln {

bool ModelIR::has_graph(const std::string& name) const {
  for (const Graph& g : graphs)
    if (g.name == name) return true;
  return false;
}

const Graph& ModelIR::graph(const std::string& name) const {
  for (const Graph& g : graphs)
    if (g.name == name) return g;
  KILN_FAIL("model has no graph named '{}'", name);
}

Graph& ModelIR::graph(const std::string& name) {
  for (Graph& g : graphs)
    if (g.name == name) return g;
  KILN_FAIL("model has no graph named '{}'", name);
}

int ModelIR::cache_layers() const {
  switch (config.arch) {
    case Architecture::kT5:
      return static_cast<int>(config.t5().num_decoder_layers);
    case Architecture::kBloom:
      return static_cast<int>(config.bloom().n_layer);
  }
  return 0;
}

int64_t ModelIR::cache_row_width() const {
  switch (config.arch) {
    case Architecture::kT5:
      return config.t5().num_heads * config.t5().d_kv;
    case Architecture::kBloom:
      return config.bloom().hidden_size;
  }
  return 0;
}

int64_t ModelIR::vocab_size() const {
  switch (config.arch) {
    case Architecture::kT5:
      return config.t5().vocab_size;
    case Architecture::kBloom:
      return config.bloom().vocab_size;
  }
  return 0;
}

int64_t ModelIR::eos_token_id() const {
  if (!config.generation.eos_token_ids.empty()) return config.generation.eos_token_ids[0];
  switch (config.arch) {
    case Architecture::kT5:
      return config.t5().eos_token_id;
    case Architecture::kBloom:
      return config.bloom().eos_token_id;
  }
  return 0;
}

int64_t ModelIR::pad_token_id() const {
  switch (config.arch) {
    case Architecture::kT5:
      return config.t5().pad_token_id;
    case Architecture::kBloom:
      return config.bloom().pad_token_id;
  }
  return 0;
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
  KILN_CHECK(model.has_graph(kDecoderGraph), "{}: no decoder graph", source);
  const Graph& dec = model.graph(kDecoderGraph);
  expect_io(dec, true, "input_ids", DType::kI64, 1, source);
  expect_io(dec, true, "logit_rows", DType::kI64, 1, source);
  expect_io(dec, false, "logits", DType::kF32, 2, source);
  const Value& logits = dec.values[dec.output("logits")];
  KILN_CHECK(logits.shape[1] == Dim::of(model.vocab_size()),
             "{}: logits are {} wide, the config's vocabulary is {}", source,
             sym_shape_str(logits.shape), model.vocab_size());
  const int layers = model.cache_layers();
  const int64_t width = model.cache_row_width();
  for (const Graph& g : model.graphs) {
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kAttention) continue;
      const AttentionAttrs& a = n.attrs.attention;
      if (a.kind == AttentionKind::kEncoderSelf) continue;
      KILN_CHECK(a.layer >= 0 && a.layer < layers,
                 "{}: attention '{}' binds cache layer {}, the model has {}", source, n.name,
                 a.layer, layers);
      KILN_CHECK(static_cast<int64_t>(a.num_heads) * a.head_dim == width,
                 "{}: attention '{}' is {}x{} wide, the cache rows are {}", source, n.name,
                 a.num_heads, a.head_dim, width);
    }
  }
  if (model.is_encoder_decoder()) {
    KILN_CHECK(model.has_graph(kEncoderGraph), "{}: encoder-decoder model without encoder graph",
               source);
    const Graph& enc = model.graph(kEncoderGraph);
    expect_io(enc, true, "input_ids", DType::kI64, 1, source);
    for (int l = 0; l < layers; ++l) {
      expect_io(enc, false, "cross_k." + std::to_string(l), DType::kF32, 2, source);
      expect_io(enc, false, "cross_v." + std::to_string(l), DType::kF32, 2, source);
      const Value& k = enc.values[enc.output("cross_k." + std::to_string(l))];
      KILN_CHECK(k.shape[1] == Dim::of(width), "{}: cross_k.{} is {}, expected rows of {}", source,
                 l, sym_shape_str(k.shape), width);
    }
  }
}

void check_prompt_template(const std::string& templ) {
  KILN_CHECK_USAGE(templ.find("{prompt}") != std::string::npos,
                   "prompt template '{}' must contain {{prompt}}", templ);
}

std::string apply_prompt_template(const std::string& templ, const std::string& prompt) {
  const size_t pos = templ.find("{prompt}");
  if (pos == std::string::npos) return prompt;
  return templ.substr(0, pos) + prompt + templ.substr(pos + 8);
}

}  // namespace kiln
