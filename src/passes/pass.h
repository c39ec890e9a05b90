// Graph passes. Each runs over one graph, logs at INFO what it changed, and leaves a graph that
// verify_graph accepts.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/logging.h"
#include "graph/linear.h"
#include "graph/model_ir.h"
#include "passes/calibration_cache.h"

namespace kiln {

// Evaluates nodes whose inputs are all constants (Cast of weights, Scale/Add/Mul of weights).
int fold_constants(Graph& graph, const Logger& log);
// Removes nodes whose outputs nobody reads and weights no node reads; renumbers values.
int eliminate_dead(Graph& graph, const Logger& log);
// Linear (+ bias) followed by an activation → one Linear with the activation fused.
int fuse_linear_activation(Graph& graph, const Logger& log);
// Residual Add followed by RMSNorm of the sum → one AddRMSNorm producing both.
int fuse_add_rms_norm(Graph& graph, const Logger& log);
// What a build asks of the precision pass beyond the precision itself.
struct PrecisionOptions {
  // Linear and Embedding nodes (by name, as `kiln inspect --layers` lists them) that compute
  // and store their weights in f32 whatever the precision.
  std::vector<std::string> keep_float;
  // Precisions with calibrated inputs (int8, W8A8: PrecisionSupport::calibrated_inputs): the
  // calibration whose scales the quantized Linears' inputs take, and what it came from (the
  // errors name it). check_calibration refuses one made for another model.
  std::optional<CalibrationCache> calibration;
  std::string calibration_source;
  // SmoothQuant factors to fold in (passes/smooth_quant.h: apply_smoothing) in a build without a
  // calibration: the smoothed fp32 model a SmoothQuant calibration runs, or an int4-weight
  // build's AWQ scales (passes/awq.h). An int8 build takes them from its calibration
  // (CalibrationCache::smoothing) instead.
  std::map<std::string, std::vector<float>> smoothing;
  // Where `smoothing` was read from (an AWQ calibration cache, for errors) and the
  // calibration_fingerprint of the model it was made for; apply_smoothing refuses another
  // model's. Empty: made by this build, nothing to check.
  std::string smoothing_source, smoothing_model;
};

// A usage error for a build of a precision with calibrated inputs (int8) without a calibration,
// saying what to pass, and for a calibration given to any other precision.
void require_calibration(Device device, Precision precision, const PrecisionOptions& options);
// require_calibration, then refuses a cache that does not match `model` (calibration_cache.h:
// another model, or other tensors). Run on the graphs as the precision pass sees them, which
// are the float plan's (what calibration ran).
void check_calibration(const ModelIR& model, const PrecisionOptions& options);
// Folds SmoothQuant's factors (the calibration's, or PrecisionOptions::smoothing) into every
// graph (passes/smooth_quant.h); nothing without any. After check_calibration, before the
// precision pass.
void apply_smoothing(ModelIR& model, const PrecisionOptions& options, const Logger& log);

// The precision pass, for every device: gives each node its weight and activation types from
// `support` (core/target.h's row for the plan's device and precision), the graph's structure and
// `options`, records in `notes` why each node or weight is kept wider than the precision, and
// carries it out. On f32-activation devices (CPU) Linear weights and Embedding tables take the
// precision's type (bf16, f16, or i8 with per-output-channel f32 scales) and everything else
// stays f32; on narrow-activation devices (CUDA fp16/bf16) every float value takes it except
// the nodes kept wide (fp16 T5's residual stream and FFN output projections), with Casts
// between and the logits widened to f32. Throws a usage error for an unsupported precision.
// Returns the matrices converted (CPU) or the weights and activations narrowed (CUDA); 0 for
// fp32.
int assign_precision(Graph& graph, const PrecisionSupport& support, const PrecisionOptions& options,
                     std::vector<PrecisionNote>* notes, const Logger& log);
// Assigns activation buffer slots by lifetime: of two assignments (slots in node order, and
// largest values first), the one with the smaller workspace at `report_bindings`, which must
// bind every symbol; logs that workspace.
// With `stream_outputs`, the graph's outputs are pooled too (streamed: Graph::value_slot), each
// living from its node to its last reader; otherwise each output has a buffer of its own.
void plan_memory(Graph& graph, const Logger& log,
                 const std::map<std::string, int64_t>& report_bindings,
                 bool stream_outputs = false);
// Removes values no node, input or output references and renumbers ids (keeps order).
void compact_values(Graph& graph);
// Removes the nodes marked in `erase` (keeping order) and renumbers producers; values produced by
// removed nodes get producer -1 (callers re-point or drop them).
void remove_nodes(Graph& graph, const std::vector<bool>& erase);
// How many node inputs and graph outputs read each value (the fusions' "used once" test).
std::vector<int> use_counts(const Graph& graph);

// Self attention's q, k and v Linears of one input -> one Linear over the stacked
// weights feeding a packed_qkv Attention. Returns the attentions rewritten.
int fuse_qkv(Graph& graph, const Logger& log);
// GatedActivation(Linear(x, w_gate), Linear(x, w_up)) -> GatedActivation(Linear(x, [w_gate;
// w_up])) reading the packed [n, 2f] rows. Returns the gated activations rewritten.
int fuse_gate_up(Graph& graph, const Logger& log);

// CUDA plans: y = Add(r, Linear(x)) -> Linear(x, ..., residual = r). Returns the adds fused.
int fuse_linear_residual(Graph& graph, const Logger& log);

// CUDA plans: y = Linear(LayerNorm(x)) (or RMSNorm) -> Linear(x, w * gamma, bias + w · beta,
// ..., row sums of w * gamma) with LinearEpilogue::norm, when Linears with float weights are the
// norm's only readers (a weight other nodes share keeps its values: gamma then becomes the
// Linear's norm scale, operand kNormScale). Returns the norms folded.
int fuse_norm_linear(Graph& graph, const Logger& log);

// CUDA fp16 / bf16 plans: Cast(Linear(x)) to f32 -> Linear(x) with LinearEpilogue::widen, which
// stores its rounded output as f32 (narrow_graph's casts: the logits, T5's fp16 Linears into
// its f32 residual stream), when the cast is the Linear's only reader. Returns the casts fused.
int fuse_linear_cast(Graph& graph, const Logger& log);

// CUDA plans: Linear(GatherRows(x, rows)) -> Linear(x, ..., rows) (operand kRows), when the
// Linear is the gathered rows' only reader (the lm_head). Returns the gathers fused.
int fuse_gather_linear(Graph& graph, const Logger& log);

// CUDA plans: LayerNorm(Embedding(table, ids)) -> LayerNorm(table, w, b, rows = ids), one kernel
// that gathers and normalizes (BLOOM's word_embeddings_layernorm), when the norm is the
// embedding's only reader. Returns the embeddings fused.
int fuse_embedding_norm(Graph& graph, const Logger& log);

// CUDA fp16 / bf16 plans from a checkpoint in the plan's type (`narrow`): Linears and
// Embeddings read the checkpoint's weights as they are, without the frontend's widening Cast
// (which constant folding would make an f32 copy of, for the precision pass to round back).
// Before fold_constants. Returns the readers rewired.
int keep_narrow_weights(Graph& graph, DType narrow, const Logger& log);

// CPU plans for AVX-512: every Linear weight (and a table an Embedding shares with one) in the
// panel16 layout of graph/packing.h; sets model.target to the ISA. Returns the weights packed.
int pack_weights(ModelIR& model, const Logger& log);

struct PassOptions {
  bool fold_constants = true;
  bool fuse = true;
  PrecisionOptions precision;
};

// The standard pipeline over every graph of a model, then verification: the two halves below.
void optimize_model(ModelIR& model, const PassOptions& options, const Logger& log);
// The passes before the precision pass (folding, fusions): they leave the float plan's graphs,
// which a calibration observes and from which several precision plans can be made (the
// sensitivity fallback builds one per quantized layer from one copy).
void optimize_before_precision(ModelIR& model, const PassOptions& options, const Logger& log);
// The rest: the calibration checked, SmoothQuant folded in, the precision pass, the fusions
// that follow it, verification and memory planning.
void optimize_from_precision(ModelIR& model, const PassOptions& options, const Logger& log);

}  // namespace kiln
