// A whole model as kiln compiles it: the neutral model description, the tokenizer (as its source
// bytes), the default prompt template, the shape profile and the graphs the runtime drives. Both
// frontends produce this; passes transform its graphs; plans serialise it.
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

#include <map>
#include <string>
#include <vector>

#include "core/target.h"
#include "graph/ir.h"
#include "graph/model_desc.h"

namespace kiln {

inline constexpr const char* kEncoderGraph = "encoder";
inline constexpr const char* kDecoderGraph = "decoder";

// The shapes a plan is compiled for. Activation workspaces are sized per token bucket (the
// smallest bucket holding a step's tokens) and allocated once per bucket, never per step.
struct ShapeProfile {
  int64_t max_input_tokens = 512;      // longest prompt a request may carry
  int64_t max_step_tokens = 512;       // most tokens one step runs (longer prefills are chunked)
  int64_t max_batch = 64;              // most sequences (beams included) in one step
  std::vector<int64_t> token_buckets;  // ascending; the last one is max_step_tokens

  // The smallest bucket >= tokens; throws when tokens exceed max_step_tokens.
  int64_t bucket_for(int64_t tokens) const;
  // Buckets 16, 64, 256, ... up to max_step_tokens (which closes the list).
  static std::vector<int64_t> default_buckets(int64_t max_step_tokens);
  // The symbol bindings a bucket's workspace is sized for: tokens = the bucket, rows = at most
  // max_batch (every logits row is one sequence's last token). The executor allocates with
  // these, and the build log and `kiln inspect` report them: one computation, one number.
  std::map<std::string, int64_t> bucket_bindings(int64_t bucket) const;
  bool operator==(const ShapeProfile&) const = default;
};
// Positive limits, ascending buckets ending at max_step_tokens; throws naming `source`.
void check_shape_profile(const ShapeProfile& profile, const std::string& source);

// Why a node computes, or a weight is stored, wider than the plan's precision (built by the
// precision pass, kept in the plan, shown by `kiln inspect`): `node` names a node kept wide (its
// activations, and its weights on devices that compute in the plan's type), `weight` a weight
// stored wider on devices that narrow only weight storage; one of them is empty.
struct PrecisionNote {
  std::string graph;
  std::string weight;
  std::string reason;
  std::string node;
  bool operator==(const PrecisionNote&) const = default;
};

struct ModelIR {
  ModelDesc desc;
  // The checkpoint's config as imported (shown by `kiln inspect`; never read at run time).
  std::string source_config_json;
  std::string tokenizer_format;  // "sentencepiece" or "byte_level_bpe" (Tokenizer::format())
  std::string tokenizer_bytes;
  // The ids the tokenizer made from tokenizer_bytes knows (Tokenizer::vocab_size(): SentencePiece's
  // pieces and T5's 100 sentinels, or BPE's vocabulary): recorded at import, checked whenever the
  // tokenizer is made again, so that bytes cut or swapped behind the checksum cannot load a smaller
  // tokenizer without a word.
  int64_t tokenizer_pieces = 0;
  // checkpoint_digest (io/safetensors.h) of the checkpoint the model was imported from: its
  // content, which calibration caches are checked against. Empty for plans written before kiln
  // recorded it.
  std::string weights_digest;
  std::string prompt_template = "{prompt}";
  ShapeProfile profile;
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;
  std::vector<PrecisionNote> precision_notes;  // empty for fp32 plans
  // What the KV cache stores (`kiln build --kv-cache`; kAuto in plans written before it).
  KvCache kv_cache = KvCache::kAuto;
  // The hardware the plan was built for, where it matters ("sm_90" for CUDA plans: the GPU
  // architecture its kernels and tactics were chosen for); empty when any machine of the device
  // runs it. A backend refuses a plan whose target it is not.
  std::string target;
  std::vector<Graph> graphs;

  bool has_graph(const std::string& name) const;
  const Graph& graph(const std::string& name) const;
  Graph& graph(const std::string& name);
};

// Checks that the graphs honour the contract above and agree with the description (vocabulary,
// cache geometry, attention layer indices), so a crafted plan cannot make kernels index out of
// bounds. Throws naming `source` and what is wrong.
void check_model_contract(const ModelIR& model, const std::string& source);

// Replaces every "{prompt}" of the template (which must contain at least one; see
// check_prompt_template) with the prompt.
std::string apply_prompt_template(const std::string& templ, const std::string& prompt);
void check_prompt_template(const std::string& templ);

}  // namespace kiln
