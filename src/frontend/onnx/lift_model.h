// Model assembly: a lifted import graph (lift_ops.h) read as a whole model — BLOOM's causal LM,
// or T5's encoder and decoder — giving the typed config and the weights under the checkpoint
// names the HF frontend reads, so that the rest of the build (graph builders, passes, plans) is
// the HF checkpoint's path. Every node the model's outputs depend on must be part of a lifted
// op (or a residual addition the assembly reads); what is left is reported by name.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/logging.h"
#include "frontend/hf/hf_config.h"
#include "frontend/onnx/lift_ops.h"

namespace kiln {

struct LiftedModel {
  ModelConfig config;
  std::map<std::string, Tensor> tensors;  // HuggingFace names
  std::vector<std::string> notes;         // what the assembly assumed, for the build log
};

// The probe shapes lifting folds an import graph with: each symbolic dimension its own size
// (the first dimension 2, the others 40, 33, 27, ...: long enough for T5's logarithmic
// buckets), numeric dimensions as declared.
std::map<std::string, Shape> lift_probe_shapes(const ImportGraph& graph);

// Throws kiln::Error naming the file, the step that failed (layer, op) and the pattern failures
// met on the way.
LiftedModel assemble_bloom(const PatternGraph& g, const LiftResult& lifted, const Logger& log);
// `encoder` and `decoder` (no past inputs): T5's two exports.
LiftedModel assemble_t5(const PatternGraph& encoder, const LiftResult& encoder_lifted,
                        const PatternGraph& decoder, const LiftResult& decoder_lifted,
                        const Logger& log);

// Whether two tensors hold the same values (same shape, equal as f32): tied embeddings.
bool same_values(const Tensor& a, const Tensor& b);

// Helpers shared by the assemblies (lift_model.cc).
class Assembly {
 public:
  Assembly(const PatternGraph& g, const LiftResult& lifted, std::string what);
  // The lifted op of `kind` reading `value` (Cast/Identity looked through); throws naming
  // `step` when there is none, with the pattern failures at nodes reading `value`.
  const LiftedOp& op_reading(int value, LiftedKind kind, const std::string& step);
  const LiftedOp* find_op_reading(int value, LiftedKind kind) const;
  // The Add node of `a` and `b` (either order); throws naming `step`.
  int add_of(int a, int b, const std::string& step);
  // The other input of an Add reading `a`, -1 if none.
  int add_partner(int a, int* add_node) const;
  // The graph output the model computes: the one named `name`, or the only output. Other
  // outputs (an exporter's present key/values) are not needed: kiln keeps its own cache.
  int model_output(const std::string& name);
  // Throws listing the nodes `output` depends on that no lifted op or used Add covers.
  void check_all_lifted(int output) const;
  [[noreturn]] void fail(const std::string& step, const std::string& what) const;
  const PatternGraph& g;
  const LiftResult& lifted;
  std::string what;  // "BLOOM" ...
  std::vector<int> used_nodes;
};

}  // namespace kiln
