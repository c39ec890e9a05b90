// Running a float model over calibration prompts and recording, through the activation observer
// (backend/observer.h), a histogram of |x| for every Linear's input (passes/calibrator.h): the
// statistics INT8 calibration turns into scales. Encoder and decoder alike: each prompt is
// generated from greedily for a few tokens, so that an encoder-decoder model's decoder (and a
// decoder-only model's decode steps) are observed too, with the scheduler batching the prompts
// as `kiln run` does. It sits in the builder layer: it runs a compiled model (runtime) and fills
// the calibrator's histograms (passes).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "builder/builder.h"
#include "io/calibration_prompts.h"
#include "passes/awq.h"
#include "passes/calibration_cache.h"
#include "passes/calibrator.h"
#include "runtime/compiled_model.h"

namespace kiln {

struct CalibrationRunOptions {
  int batch = 8;           // prompts generated from together (--calib-batch)
  int64_t new_tokens = 8;  // greedy tokens generated per prompt (bounded: EOS may end sooner)
  int histogram_bins = AbsHistogram::kDefaultBins;
  // Rows of each calibrated tensor kept as samples (ActivationStats::samples; AWQ's search
  // measures its Linears' output error on them); 0 keeps none.
  int64_t sample_rows = 0;
};

// Rows of one calibrated tensor: a uniform sample of every row observed (reservoir sampling with
// a fixed seed, so a calibration run repeats exactly), row-major [rows, width].
struct RowSample {
  int64_t width = 0;
  int64_t seen = 0;         // rows observed
  std::vector<float> rows;  // at most sample_rows rows
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  int64_t count() const { return width > 0 ? static_cast<int64_t>(rows.size()) / width : 0; }
  // Offers `n` rows of `width` at `x` to a sample of at most `capacity` rows.
  void offer(const float* x, int64_t n, int64_t row_width, int64_t capacity);
};

struct ActivationStats {
  // calibrated_tensors(model) -> the histogram of |x| over every step that ran it.
  std::map<std::string, AbsHistogram> histograms;
  // The same tensors' largest |x| per channel (their last dimension): what SmoothQuant's
  // factors are made from (passes/smooth_quant.h).
  std::map<std::string, std::vector<float>> channel_amax;
  // Their mean |x| per channel over every row observed (AWQ's activation magnitudes).
  std::map<std::string, std::vector<float>> channel_mean_abs;
  // Sampled rows per tensor, with CalibrationRunOptions::sample_rows > 0.
  std::map<std::string, RowSample> samples;
  int64_t prompts = 0;
  int64_t prompt_tokens = 0;     // the prompts' tokens (with the model's prompt template)
  int64_t generated_tokens = 0;  // tokens decoded after the prompts
  int64_t steps = 0;             // scheduler steps
};

// Runs `model` (a float plan: fp32, fp16 or bf16) over `prompts` and returns the statistics of
// every calibrated tensor; logs at INFO how many prompts and tokens were seen, with a progress
// line on a terminal. Throws naming a prompt (its origin) that is longer than the plan allows,
// a quantized plan, and a tensor that was never observed or held a value that is not finite.
ActivationStats collect_activation_stats(CompiledModel& model,
                                         const std::vector<CalibrationPrompt>& prompts,
                                         const CalibrationRunOptions& options = {});

// The cache of the statistics calibrated with `method`, for `model`.
CalibrationCache calibrate_model(const ModelIR& model, const ActivationStats& stats,
                                 const CalibrationMethodSpec& method);

// The options of the fp32 CPU model that calibration, AWQ's search and the sensitivity fallback
// run for a build with `options`: a cuda build's calibration runs on the CPU too (no GPU needed
// to build; its graphs up to the precision pass name the same Linear inputs, and
// check_calibration compares the fingerprints).
BuildOptions cpu_float_options(const BuildOptions& options);

// What `kiln build --precision int8 --calib FILE` runs before it builds: the checkpoint built as
// the fp32 CPU plan of `options` (the same passes before the precision pass, so every value
// observed is the f32 input an int8 plan's Linear quantizes), run over `prompts`, and
// calibrated with `method`. With `smoothquant_alpha` > 0 (SmoothQuant, passes/smooth_quant.h),
// that first run gives each smoothable tensor's channel maxima, from which and the weights the
// smoothing factors are made; the fp32 model is built again with them folded in and run again,
// and the cache holds the factors and the smoothed tensors' scales. The float models are gone
// when it returns; `stats` (optional) gets the (last run's) statistics.
CalibrationCache calibrate_checkpoint(Context& ctx, const ModelSource& source,
                                      const BuildOptions& options,
                                      const std::vector<CalibrationPrompt>& prompts,
                                      const CalibrationRunOptions& run,
                                      const CalibrationMethodSpec& method,
                                      ActivationStats* stats = nullptr,
                                      double smoothquant_alpha = 0.0);

// Rows of each int4 Linear input that `kiln build --awq` samples for the search.
inline constexpr int64_t kAwqSampleRows = 128;

// What `kiln build --precision int4-weight --awq --calib FILE` runs before it builds: the
// model built as the fp32 plan of `options` (plain weights, as the search reads them), run over
// `prompts` keeping run.sample_rows rows of every Linear input (at least 1), and AWQ's scale
// search (passes/awq.h) over the int4 Linears' inputs. The result's factors go into
// PrecisionOptions::smoothing. Logs each tensor's choice at DEBUG and a summary at INFO.
AwqResult awq_checkpoint(Context& ctx, const ModelSource& source, const BuildOptions& options,
                         const std::vector<CalibrationPrompt>& prompts,
                         const CalibrationRunOptions& run, int grid = 20);

}  // namespace kiln
