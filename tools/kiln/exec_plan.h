// `kiln exec --plan`: one forward pass of a plan's model on padded [batch, sequence] inputs, as
// the ONNX exports take them, through the plan's own graphs (each row one sequence: its tokens
// where attention_mask is nonzero, in order). Graphs:
//   decoder-only plans, "decoder": input_ids, attention_mask (optional) -> logits [b, s, vocab]
//   encoder-decoder plans, "encoder": input_ids, attention_mask (optional)
//                                     -> last_hidden_state [b, s, d_model]
//   encoder-decoder plans, "decoder": input_ids, attention_mask (optional), decoder_input_ids
//                                     -> logits [b, t, vocab]
//                          or, as a T5 decoder export takes them: input_ids (the decoder's),
//                          encoder_hidden_states [b, s, d_model], encoder_attention_mask
//                          (optional) -> logits [b, t, vocab] (the encoder does not run: its
//                          cross K/V projections run on the states given)
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
// The other input set of an encoder-decoder plan's decoder: a decoder export's.
std::vector<std::string> plan_exec_decoder_export_inputs();

}  // namespace kiln::cli
