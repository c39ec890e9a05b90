#include "graph/verifier.h"
#include "passes/pass.h"
#include "passes/smooth_quant.h"

namespace kiln {

void require_calibration(Device device, Precision precision, const PrecisionOptions& options) {
  if (!precision_support(device, precision).calibrated_inputs) {
    KILN_CHECK_USAGE(!options.calibration,
                     "a calibration ({}) is for --precision int8 plans, not {}",
                     options.calibration_source, precision_name(precision));
    return;
  }
  KILN_CHECK_USAGE(options.calibration.has_value(),
                   "--precision {} quantizes every Linear's input to int8 with a calibrated "
                   "scale, so it needs calibration data: pass --calib FILE.jsonl (a few hundred "
                   "representative prompts, one JSON string or {{\"prompt\": ...}} per line) or "
                   "--calib-cache FILE (written by kiln calibrate or an earlier --calib build)",
                   precision_name(precision));
}

void check_calibration(const ModelIR& model, const PrecisionOptions& options) {
  require_calibration(model.device, model.precision, options);
  if (!options.calibration) return;
  check_calibration_cache(*options.calibration, options.calibration_source,
                          calibration_fingerprint(model), calibrated_tensors(model));
  // The layers the sensitivity fallback kept in float must be this model's.
  for (const auto& [name, error] : options.calibration->fallback) {
    bool found = false;
    for (const Graph& g : model.graphs)
      for (const Node& n : g.nodes)
        found |= n.name == name && (n.op == OpKind::kLinear || n.op == OpKind::kEmbedding);
    KILN_CHECK_USAGE(found,
                     "calibration cache {} keeps layer {} in float, and the model has no Linear "
                     "or Embedding of that name",
                     options.calibration_source, name);
  }
}

void apply_smoothing(ModelIR& model, const PrecisionOptions& options, const Logger& log) {
  KILN_CHECK(options.smoothing.empty() || !options.calibration,
             "SmoothQuant factors come from the calibration or from the build, not both");
  if (!options.smoothing_model.empty()) {
    const std::string fingerprint = calibration_fingerprint(model);
    KILN_CHECK_USAGE(options.smoothing_model == fingerprint,
                     "{} was made for another model (fingerprint {}; this model's is {}): run "
                     "the search again with --calib",
                     options.smoothing_source, options.smoothing_model, fingerprint);
  }
  const auto& factors = options.calibration ? options.calibration->smoothing : options.smoothing;
  if (factors.empty()) return;
  for (Graph& g : model.graphs) apply_smoothing(g, factors, options.keep_float, log);
}

void optimize_before_precision(ModelIR& model, const PassOptions& options, const Logger& log) {
  // The graphs these passes leave are the float plan's, whose Linear inputs a calibration
  // observed (check_calibration compares them).
  for (Graph& g : model.graphs) {
    // The Casts whose readers keep_narrow_weights rewires to the narrow weights go before
    // folding: fold_constants would otherwise widen each of them (the checkpoint in f32).
    if (model.device == Device::kCuda && options.fold_constants &&
        keep_narrow_weights(g, precision_support(model.device, model.precision).activation, log) >
            0)
      eliminate_dead(g, log);
    if (options.fold_constants) fold_constants(g, log);
    eliminate_dead(g, log);
    if (options.fuse) {
      fuse_linear_activation(g, log);
      fuse_add_rms_norm(g, log);
    }
    if (options.fuse && model.device == Device::kCuda) fuse_linear_residual(g, log);
    // Before assign_precision: the stacked weight is narrowed or quantized as
    // one (per-row scales are the rows' own).
    if (options.fuse) {
      fuse_qkv(g, log);
      fuse_gate_up(g, log);
    }
  }
}

void optimize_from_precision(ModelIR& model, const PassOptions& options, const Logger& log) {
  check_calibration(model, options.precision);
  apply_smoothing(model, options.precision, log);
  for (Graph& g : model.graphs) {
    assign_precision(g, precision_support(model.device, model.precision), options.precision,
                     &model.precision_notes, log);
    if (model.device == Device::kCuda) {
      if (options.fuse) {
        fuse_norm_linear(g, log);
        fuse_embedding_norm(g, log);
        fuse_linear_cast(g, log);
        fuse_gather_linear(g, log);
      }
    }
    verify_graph(g);
    // Report the workspace of the largest bucket (what a full step needs), with the bindings
    // the executor allocates it for, so that `kiln inspect` shows the same number. On the CPU,
    // T5's encoder streams its outputs: the runtime copies each cross K/V projection out to the
    // requests as it is written (a batch-16 prompt step's 24 projections are 34 MB of f32, all
    // resident until the step's end otherwise). CUDA keeps them (its cross K/V copy is one
    // launch after the step).
    const ShapeProfile& p = model.profile;
    plan_memory(
        g, log,
        p.bucket_bindings(p.token_buckets.empty() ? p.max_step_tokens : p.token_buckets.back()),
        model.device == Device::kCpu && g.name == kEncoderGraph);
  }
}

void optimize_model(ModelIR& model, const PassOptions& options, const Logger& log) {
  optimize_before_precision(model, options, log);
  optimize_from_precision(model, options, log);
}

}  // namespace kiln
