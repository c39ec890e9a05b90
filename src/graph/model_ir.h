// A whole model as kiln compiles it: the typed config, the tokenizer (as its source bytes), the
// default prompt template and the graphs the runtime drives. Both frontends produce this; passes
// transform its graphs; plans serialise it.
//
// Graph contract (what the runtime feeds and reads):
//   "encoder" (encoder-decoder models only)
//       inputs  input_ids [tokens] i64
//       outputs encoder_hidden [tokens, d_model], cross_k.L / cross_v.L [tokens, H*dh] per
//               decoder layer L (computed once per request, shared by all its beams)
//   "decoder" (every model)
//       inputs  input_ids [tokens] i64, logit_rows [rows] i64 (which token rows need logits)
//       outputs logits [rows, vocab] f32
#pragma once

#include <string>
#include <vector>

#include "graph/ir.h"
#include "io/hf_config.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

inline constexpr const char* kEncoderGraph = "encoder";
inline constexpr const char* kDecoderGraph = "decoder";

struct ModelIR {
  ModelConfig config;
  TokenizerKind tokenizer_kind = TokenizerKind::kSentencePiece;
  std::string tokenizer_bytes;
  std::string prompt_template = "{prompt}";
  // Longest prompt (in tokens) requests may carry; longer ones are refused with a usage error.
  int64_t max_input_tokens = 512;
  std::vector<Graph> graphs;

  bool has_graph(const std::string& name) const;
  const Graph& graph(const std::string& name) const;
  Graph& graph(const std::string& name);
  // Layers that own a self-attention KV cache, and its row width (heads * head_dim).
  int cache_layers() const;
  int64_t cache_row_width() const;
  int64_t vocab_size() const;
  int64_t eos_token_id() const;
  int64_t pad_token_id() const;
  bool is_encoder_decoder() const { return config.arch == Architecture::kT5; }
};

// Checks that the graphs honour the contract above and agree with the config (vocabulary,
// cache geometry, attention layer indices), so a crafted plan cannot make kernels index out of
// bounds. Throws naming `source` and what is wrong.
void check_model_contract(const ModelIR& model, const std::string& source);

// Applies a template containing "{prompt}" (checked when the template is set).
std::string apply_prompt_template(const std::string& templ, const std::string& prompt);
void check_prompt_template(const std::string& templ);

}  // namespace kiln
