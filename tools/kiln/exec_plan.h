// `kiln exec --plan`: one forward pass of a plan's model on padded [batch, sequence] inputs, as
// the ONNX exports take them, through the plan's own graphs (each row one sequence: its tokens
// where attention_mask is nonzero, in order). Graphs:
//   decoder-only plans, "decoder": input_ids, attention_mask (optional) -> logits [b, s, vocab]
//   encoder-decoder plans, "encoder": input_ids, attention_mask (optional)
//                                     -> last_hidden_state [b, s, d_model]
//   encoder-decoder plans, "decoder": input_ids, attention_mask (optional), decoder_input_ids
//                                     -> logits [b, t, vocab]
// Values at padded positions are zeros.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/compiled_model.h"

namespace kiln::cli {

struct PlanExec {
  std::string graph;
  std::map<std::string, Tensor> outputs;
  std::vector<std::string> order;  // output names
  int64_t sequences = 0;
};

// Usage errors (exit 2) name the input and what was expected.
PlanExec run_plan_exec(CompiledModel& engine, const std::string& graph,
                       const std::map<std::string, Tensor>& inputs);

// The input names a plan's graph takes, for --help and errors.
std::vector<std::string> plan_exec_inputs(const ModelDesc& desc, const std::string& graph);

}  // namespace kiln::cli
