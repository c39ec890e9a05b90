#include "exec_plan.h"

#include <cstring>

#include "runtime/forward.h"

namespace kiln::cli {
namespace {

std::vector<int64_t> ints_of(const Tensor& t) {
  const Tensor c = t.dtype() == DType::kI64 ? t : t.to(DType::kI64);
  return std::vector<int64_t>(c.data<int64_t>(), c.data<int64_t>() + c.numel());
}

const Tensor& batch_input(const std::map<std::string, Tensor>& inputs, const std::string& name) {
  const auto it = inputs.find(name);
  KILN_CHECK_USAGE(it != inputs.end(), "--inputs: no tensor '{}' (the graph reads it)", name);
  const Tensor& t = it->second;
  KILN_CHECK_USAGE(t.rank() == 2 && (t.dtype() == DType::kI64 || t.dtype() == DType::kI32 ||
                                     t.dtype() == DType::kI8),
                   "--inputs: '{}' is {}{}, expected an integer [batch, sequence] tensor", name,
                   dtype_name(t.dtype()), shape_str(t.shape()));
  KILN_CHECK_USAGE(t.dim(0) > 0 && t.dim(1) > 0, "--inputs: '{}' is empty ({})", name,
                   shape_str(t.shape()));
  return t;
}

// Row r's tokens where the mask is nonzero, and their positions.
struct Row {
  std::vector<int64_t> ids, positions;
};
std::vector<Row> rows_of(const Tensor& ids_t, const Tensor* mask_t, const std::string& ids_name) {
  const std::vector<int64_t> ids = ints_of(ids_t);
  std::vector<int64_t> mask(ids.size(), 1);
  if (mask_t) {
    KILN_CHECK_USAGE(mask_t->shape() == ids_t.shape(),
                     "--inputs: attention_mask is {}, {} is {}: they must have one shape",
                     shape_str(mask_t->shape()), ids_name, shape_str(ids_t.shape()));
    mask = ints_of(*mask_t);
  }
  const int64_t b = ids_t.dim(0), s = ids_t.dim(1);
  std::vector<Row> rows(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t i = 0; i < s; ++i)
      if (mask[r * s + i] != 0) {
        rows[r].ids.push_back(ids[r * s + i]);
        rows[r].positions.push_back(i);
      }
    KILN_CHECK_USAGE(!rows[r].ids.empty(), "--inputs: row {} of attention_mask is all zeros", r);
  }
  return rows;
}

void check_names(const std::map<std::string, Tensor>& inputs, const std::vector<std::string>& known,
                 const std::string& graph) {
  for (const auto& [name, t] : inputs) {
    bool ok = false;
    for (const std::string& k : known) ok = ok || k == name;
    KILN_CHECK_USAGE(ok, "--inputs: '{}' is not an input of the plan's {} graph (inputs: {})", name,
                     graph, fmt::join(known, ", "));
  }
}

void check_ids(const std::vector<int64_t>& ids, int64_t vocab, const std::string& name) {
  for (int64_t id : ids)
    KILN_CHECK_USAGE(id >= 0 && id < vocab, "--inputs: {} holds id {}, outside [0, {})", name, id,
                     vocab);
}

// Scatters per-row [n, width] results into [b, s, width] at the rows' positions.
void place(Tensor& out, int64_t r, const std::vector<int64_t>& positions, const Tensor& rows) {
  const int64_t s = out.dim(1), width = out.dim(2);
  const Tensor f = rows.to_f32();
  for (size_t i = 0; i < positions.size(); ++i)
    std::memcpy(out.data<float>() + (r * s + positions[i]) * width,
                f.data<float>() + static_cast<int64_t>(i) * width, sizeof(float) * width);
}

Tensor zeros_f32(Shape shape) {
  Tensor t = Tensor::empty(DType::kF32, std::move(shape));
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

}  // namespace

std::vector<std::string> plan_exec_inputs(const ModelDesc& desc, const std::string& graph) {
  if (desc.encoder_decoder && graph == kDecoderGraph)
    return {"input_ids", "attention_mask", "decoder_input_ids"};
  return {"input_ids", "attention_mask"};
}

std::vector<std::string> plan_exec_decoder_export_inputs() {
  return {"input_ids", "encoder_hidden_states", "encoder_attention_mask"};
}

namespace {

// A T5 decoder export's inputs: decoder input_ids [b, t], encoder_hidden_states [b, s, d] and
// an optional encoder_attention_mask [b, s]; each row's states where the mask is nonzero.
PlanExec run_decoder_on_states(CompiledModel& engine, const std::map<std::string, Tensor>& inputs) {
  const ModelDesc& desc = engine.desc();
  check_names(inputs, plan_exec_decoder_export_inputs(), "decoder (given encoder states)");
  const Tensor& dec = batch_input(inputs, "input_ids");
  const Tensor& states = inputs.at("encoder_hidden_states");
  KILN_CHECK_USAGE(
      states.rank() == 3 && (states.dtype() == DType::kF32 || states.dtype() == DType::kF16 ||
                             states.dtype() == DType::kBF16),
      "--inputs: 'encoder_hidden_states' is {}{}, expected a float [batch, "
      "sequence, d_model] tensor",
      dtype_name(states.dtype()), shape_str(states.shape()));
  const int64_t b = dec.dim(0), s = states.dim(1), width = states.dim(2);
  KILN_CHECK_USAGE(states.dim(0) == b && s > 0,
                   "--inputs: encoder_hidden_states is {}, input_ids {}: one row of states per "
                   "row of ids",
                   shape_str(states.shape()), shape_str(dec.shape()));
  std::vector<int64_t> mask(static_cast<size_t>(b * s), 1);
  if (const auto it = inputs.find("encoder_attention_mask"); it != inputs.end()) {
    const Tensor& m = batch_input(inputs, "encoder_attention_mask");
    KILN_CHECK_USAGE(m.dim(0) == b && m.dim(1) == s,
                     "--inputs: encoder_attention_mask is {}, encoder_hidden_states {}: the mask "
                     "is [batch, sequence] of the states",
                     shape_str(m.shape()), shape_str(states.shape()));
    mask = ints_of(m);
  }
  const Tensor f = states.to_f32();
  DecoderOnStates decoder(engine);
  Tensor logits = zeros_f32({b, dec.dim(1), desc.vocab_size});
  const std::vector<Row> dec_rows = rows_of(dec, nullptr, "input_ids");
  for (int64_t r = 0; r < b; ++r) {
    check_ids(dec_rows[r].ids, desc.vocab_size, "input_ids");
    std::vector<int64_t> kept;
    for (int64_t i = 0; i < s; ++i)
      if (mask[static_cast<size_t>(r * s + i)] != 0) kept.push_back(i);
    KILN_CHECK_USAGE(!kept.empty(), "--inputs: row {} of encoder_attention_mask is all zeros", r);
    Tensor row = Tensor::empty(DType::kF32, {static_cast<int64_t>(kept.size()), width});
    for (size_t i = 0; i < kept.size(); ++i)
      std::memcpy(row.data<float>() + static_cast<int64_t>(i) * width,
                  f.data<float>() + (r * s + kept[i]) * width, sizeof(float) * width);
    place(logits, r, dec_rows[r].positions, decoder.run(row, dec_rows[r].ids).logits);
  }
  PlanExec result;
  result.graph = kDecoderGraph;
  result.sequences = b;
  result.outputs["logits"] = logits;
  result.order = {"logits"};
  return result;
}

}  // namespace

PlanExec run_plan_exec(CompiledModel& engine, const std::string& graph,
                       const std::map<std::string, Tensor>& inputs) {
  const ModelDesc& desc = engine.desc();
  KILN_CHECK_USAGE(graph == kDecoderGraph || (graph == kEncoderGraph && desc.encoder_decoder),
                   "--graph {}: the plan's graphs are {}", graph,
                   desc.encoder_decoder ? "encoder and decoder" : "decoder");
  if (desc.encoder_decoder && graph == kDecoderGraph && inputs.count("encoder_hidden_states"))
    return run_decoder_on_states(engine, inputs);
  check_names(inputs, plan_exec_inputs(desc, graph), graph);
  const Tensor& ids = batch_input(inputs, "input_ids");
  const auto mask_it = inputs.find("attention_mask");
  const Tensor* mask = mask_it == inputs.end() ? nullptr : &batch_input(inputs, "attention_mask");
  const std::vector<Row> rows = rows_of(ids, mask, "input_ids");
  for (const Row& row : rows) check_ids(row.ids, desc.vocab_size, "input_ids");
  const int64_t b = ids.dim(0), s = ids.dim(1);
  PlanExec result;
  result.graph = graph;
  result.sequences = b;
  if (!desc.encoder_decoder) {
    Tensor logits = zeros_f32({b, s, desc.vocab_size});
    for (int64_t r = 0; r < b; ++r)
      place(logits, r, rows[r].positions, run_forward(engine, {}, rows[r].ids, false).logits);
    result.outputs["logits"] = logits;
    result.order = {"logits"};
    return result;
  }
  if (graph == kEncoderGraph) {
    Tensor hidden;
    for (int64_t r = 0; r < b; ++r) {
      // The decoder runs one start token; only the encoder's states are kept.
      const Forward f = run_forward(engine, rows[r].ids, {desc.decoder_start_token_id}, false);
      if (!hidden.defined()) hidden = zeros_f32({b, s, f.encoder_hidden.dim(1)});
      place(hidden, r, rows[r].positions, f.encoder_hidden);
    }
    result.outputs["last_hidden_state"] = hidden;
    result.order = {"last_hidden_state"};
    return result;
  }
  const Tensor& dec = batch_input(inputs, "decoder_input_ids");
  KILN_CHECK_USAGE(dec.dim(0) == b, "--inputs: decoder_input_ids has {} rows, input_ids {}",
                   dec.dim(0), b);
  const std::vector<Row> dec_rows = rows_of(dec, nullptr, "decoder_input_ids");
  Tensor logits = zeros_f32({b, dec.dim(1), desc.vocab_size});
  for (int64_t r = 0; r < b; ++r) {
    check_ids(dec_rows[r].ids, desc.vocab_size, "decoder_input_ids");
    place(logits, r, dec_rows[r].positions,
          run_forward(engine, rows[r].ids, dec_rows[r].ids, false).logits);
  }
  result.outputs["logits"] = logits;
  result.order = {"logits"};
  return result;
}

}  // namespace kiln::cli
