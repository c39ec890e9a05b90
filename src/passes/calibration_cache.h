// The calibration cache: a calibration's result as a small text file that a later build reuses
// instead of running the calibration prompts again (TensorRT's calibration cache).
//
//   kiln-calibration-cache 1 model=1f54aba9c3d8089e method=entropy
//   decoder/decoder.block.0.layer.0.SelfAttention.attn 0.026299354
//   ...
//
// The header names the model (calibration_fingerprint: its checkpoint's content, which tensors
// it calibrates and their shapes, its config and tokenizer) and the method; then one line per
// calibrated tensor: its name (graph/value, no whitespace) and its int8 scale as the shortest
// decimal that reads back as the same float (and, from the sensitivity fallback, `float` lines:
// the layers kept in f32). A cache that does not match the model it is used for
// is refused, naming what differs.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/model_ir.h"

namespace kiln {

// What quantizing one layer alone does to the model's next-token distributions, against the
// float plan on the same tokens (builder/sensitivity.h): the mean over scored positions of
// KL(float || quantized) in nats, and the fraction of positions whose top-1 token agrees.
struct LayerSensitivity {
  double mean_kl = 0.0;
  double top1_agreement = 1.0;
  bool operator==(const LayerSensitivity&) const = default;
};

// Why the sensitivity fallback keeps a layer in f32, for the build log and `kiln inspect`: its
// measured error and the tolerance the whole model was brought under.
std::string fallback_reason(const LayerSensitivity& error, double quant_tolerance);

struct CalibrationCache {
  std::string model;   // calibration_fingerprint of the model it was made for (16 hex digits)
  std::string method;  // calibration_method_name
  std::map<std::string, float> scales;  // tensor name -> scale
  // SmoothQuant (kiln build --smoothquant ALPHA; passes/smooth_quant.h): its alpha (0: none)
  // and, per smoothed tensor, the factor of each channel (its last dimension) that the tensor
  // is divided by — folded into the norm that makes it — and its readers' weight columns are
  // multiplied by. `scales` are then the smoothed tensors' scales. Written as version 2 of the
  // format: `smoothquant=ALPHA` in the header, and `smooth TENSOR F0 F1 ...` lines.
  double smoothquant_alpha = 0.0;
  std::map<std::string, std::vector<float>> smoothing;
  // The sensitivity fallback (kiln build --quant-tolerance; builder/sensitivity.h), when the
  // build that calibrated ran it: the whole-model mean KL it brought the plan under (negative:
  // not run), and the Linear and Embedding nodes it keeps in f32, by name, each with what
  // quantizing it alone measured. Version 3 of the format: `quant-tolerance=T` in the header,
  // and `float NODE MEAN_KL TOP1_AGREEMENT` lines. A cache-only build keeps the same layers.
  double quant_tolerance = -1.0;
  std::map<std::string, LayerSensitivity> fallback;
  // method "awq" (kiln build --precision int4-weight --awq; passes/awq.h): `smoothing` holds
  // AWQ's factors for an int4-weight plan, and nothing else is set. Version 4 of the format: a
  // header with method=awq, then `smooth TENSOR F0 F1 ...` lines.
  bool awq() const { return method == kAwqMethod; }
  static constexpr const char* kAwqMethod = "awq";
  bool operator==(const CalibrationCache&) const = default;
};

// The tensors a model's calibration covers: the input (LinearOperand::kX) of every Linear of
// every graph, named "graph/value" (Linears reading one value share its scale), in graph and
// node order without repeats.
std::vector<std::string> calibrated_tensors(const ModelIR& model);
// The name calibrated_tensors gives value `value` of `graph`.
std::string calibrated_tensor_name(const Graph& graph, int value);
// 16 hex digits identifying the model for its cache: its source config and tokenizer, its
// checkpoint's content (ModelIR::weights_digest: a model of the same shapes with other weights
// differs), and every calibrated tensor's name and shape. A usage error for a model without a
// weights digest (a plan written before kiln recorded one).
std::string calibration_fingerprint(const ModelIR& model);

// Written atomically (io/atomic_file.h); throws naming `path`.
void write_calibration_cache(const std::string& path, const CalibrationCache& cache);
// Throws naming path:line for a malformed line, a repeated name, a scale that is not a finite
// non-negative number, or a missing or foreign header.
CalibrationCache read_calibration_cache(const std::string& path);
// Refuses (a usage error naming `source`) a cache made for another model (its fingerprint and
// the model's), or whose tensors differ from `expected` (the names missing from it and the
// names it has that the model lacks, the first few of each).
void check_calibration_cache(const CalibrationCache& cache, const std::string& source,
                             const std::string& fingerprint,
                             const std::vector<std::string>& expected);

}  // namespace kiln
