// The sensitivity fallback of int8 (W8A8) builds: which quantized layers to keep in float so that
// the whole plan stays close to the float model. On a bounded number of calibration prompts, the
// fp32 plan generates greedily; every plan compared is then run teacher-forced on those same
// tokens (runtime/forced_logits.h), and its next-token distributions are compared with the fp32
// plan's: mean KL(fp32 || plan) in nats per scored position, and top-1 agreement.
//  1. Each quantized layer alone (every other layer float) gives that layer's error.
//  2. Layers are ranked worst first, and the fewest worst layers are kept in float for which the
//     whole int8 plan's mean KL is at most the tolerance: the plan without fallback first, then
//     the worst 1, 2, 4, ... kept, then a bisection between the last two counts measured (more
//     layers in float lowers the error; the count chosen is always one that was measured under
//     the tolerance).
// A layer is the set of nodes that read one quantized weight matrix (BLOOM's tied embedding and
// lm_head are one layer). The result is recorded in the calibration cache (CalibrationCache::
// fallback), whose layers the precision pass keeps in f32 with their measured error as the
// reason, so a cache-only rebuild makes the same plan. It sits in the builder layer: it builds
// plans (passes) and runs them (runtime).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "builder/builder.h"
#include "io/calibration_prompts.h"
#include "passes/calibration_cache.h"

namespace kiln {

// The default --quant-tolerance, mean KL in nats per next-token position. Measured on 32
// calibration prompts (docs/cli.md has the table): the fixture models' W8A8 plans of every layer
// are at 4e-4 (t5-tiny, one point of dev accuracy below fp32) and 4e-5 (bloom-tiny, 0.2 points)
// with 100 % top-1 agreement; a t5-tiny copy with an activation outlier that a per-tensor scale
// cannot hold (tests/models/test_sensitivity.cc) is at 0.14 (95 % agreement; dev accuracy 0.53
// against fp32's 0.997) and keeps that one layer float, ending at 6e-4 (0.988). 1e-3 leaves plans
// that behave like those healthy ones int8 and catches layers that break, two orders of magnitude
// above it; a tighter tolerance buys back the last point (1e-4 keeps 4 of t5-tiny's 51 layers float
// and matches fp32).
inline constexpr double kDefaultQuantTolerance = 1e-3;
inline constexpr int kDefaultSensitivityPrompts = 32;

struct SensitivityOptions {
  // Most mean KL(fp32 || plan) the whole int8 plan may have, in nats per scored position; >= 0.
  double tolerance = kDefaultQuantTolerance;
  int prompts = kDefaultSensitivityPrompts;  // the first N calibration prompts are scored
  int64_t new_tokens = 8;  // greedy tokens the fp32 plan generates per prompt (all scored)
};

// Throws a usage error naming the option for a negative or non-finite tolerance, fewer than one
// prompt, or fewer than one generated token.
void check_sensitivity_options(const SensitivityOptions& options);

// --quant-tolerance's value: a mean KL in nats per token ("0.001", "1e-3"), or "off" (nullopt:
// no fallback). Throws a usage error naming the value for anything else, a negative number,
// inf or nan.
std::optional<double> parse_quant_tolerance(const std::string& text);

struct LayerMeasurement {
  std::vector<std::string> nodes;  // the nodes reading the layer's weight matrix
  std::string weight;              // that matrix (graph/value)
  LayerSensitivity error;          // with only this layer quantized
};

struct SensitivityReport {
  std::vector<LayerMeasurement> layers;  // every quantized layer, worst first
  size_t kept = 0;                       // the first `kept` of `layers` stay float
  LayerSensitivity all_int8;             // every layer quantized
  LayerSensitivity chosen;               // the plan with the kept layers float
  int64_t prompts = 0;
  int64_t positions = 0;   // next-token positions scored per plan
  int plans_measured = 0;  // plans built and scored (the fp32 one not counted)
  double seconds = 0.0;
};

// Measures the int8 plan of `options` (an int8 build with its calibration in
// options.precision_options.calibration) against its fp32 plan on the first options.prompts of
// `prompts`, chooses the layers to keep in float, and records them and the tolerance in the
// calibration (options.precision_options.calibration's copy, returned). Logs every layer's
// error (at INFO, the kept ones marked) and the summary, with progress on a terminal.
CalibrationCache apply_sensitivity_fallback(Context& ctx, const ModelSource& source,
                                            const BuildOptions& options,
                                            const std::vector<CalibrationPrompt>& prompts,
                                            const SensitivityOptions& sensitivity,
                                            SensitivityReport* report = nullptr);

}  // namespace kiln
