#include "builder/calibration_runner.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "core/logging.h"
#include "graph/linear.h"
#include "passes/smooth_quant.h"
#include "runtime/scheduler.h"

namespace kiln {

ActivationStats collect_activation_stats(CompiledModel& model,
                                         const std::vector<CalibrationPrompt>& prompts,
                                         const CalibrationRunOptions& options) {
  const ModelIR& ir = model.model();
  KILN_CHECK_USAGE(ir.precision == Precision::kFp32 || ir.precision == Precision::kFp16 ||
                       ir.precision == Precision::kBf16,
                   "calibration runs a float plan (fp32, fp16 or bf16); this one is {}",
                   precision_name(ir.precision));
  KILN_CHECK_USAGE(options.batch > 0, "the calibration batch must be at least 1, got {}",
                   options.batch);
  KILN_CHECK_USAGE(options.new_tokens > 0,
                   "calibration must generate at least 1 token per prompt, got {}",
                   options.new_tokens);
  const Logger& log = model.context().log();
  KILN_CHECK_USAGE(options.sample_rows >= 0, "calibration sample rows must be >= 0, got {}",
                   options.sample_rows);
  ActivationStats stats;
  std::map<std::string, std::vector<double>> abs_sums;
  std::map<std::string, int64_t> rows_seen;
  const std::vector<std::string> names = calibrated_tensors(ir);
  for (const std::string& name : names) {
    stats.histograms.emplace(name, AbsHistogram(options.histogram_bins));
    stats.channel_amax.emplace(name, std::vector<float>());
  }

  // Every prompt is checked before anything runs.
  const Tokenizer& tok = model.tokenizer();
  const int64_t limit = ir.profile.max_input_tokens;
  std::vector<std::vector<int64_t>> ids(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids[i] = tok.encode(apply_prompt_template(ir.prompt_template, prompts[i].text));
    const int64_t len = static_cast<int64_t>(ids[i].size());
    KILN_CHECK_USAGE(len <= limit, "{}: the prompt is {} tokens; the plan allows at most {}",
                     prompts[i].origin, len, limit);
    stats.prompt_tokens += len;
  }

  ActivationObserver observer;
  observer.selection.ops = {OpKind::kLinear};
  observer.selection.side = ObservedSide::kInput;
  observer.selection.slot = static_cast<int>(slot(LinearOperand::kX));
  observer.callback = [&stats, &abs_sums, &rows_seen, &options](const Observation& ob) {
    const Node& node = ob.graph.nodes[static_cast<size_t>(ob.node)];
    const std::string name =
        calibrated_tensor_name(ob.graph, linear_operand(node, LinearOperand::kX));
    auto it = stats.histograms.find(name);
    KILN_CHECK(it != stats.histograms.end(), "calibration: Linear '{}' reads {}, not calibrated",
               ob.node_name, name);
    const Tensor values = ob.value.dtype() == DType::kF32 ? ob.value : ob.value.to_f32();
    std::vector<float>& channels = stats.channel_amax.at(name);
    const int64_t width = values.rank() > 0 ? values.dim(values.rank() - 1) : 1;
    if (channels.empty()) channels.assign(static_cast<size_t>(width), 0.0f);
    KILN_CHECK(static_cast<int64_t>(channels.size()) == width,
               "calibration: {} has {} channels in one step and {} in another", name,
               channels.size(), width);
    const float* v = values.data<float>();
    std::vector<double>& sums = abs_sums[name];
    if (sums.empty()) sums.assign(static_cast<size_t>(width), 0.0);
    for (int64_t i = 0; i < values.numel(); ++i) {
      channels[i % width] = std::max(channels[i % width], std::fabs(v[i]));
      sums[i % width] += std::fabs(v[i]);
    }
    const int64_t rows = width > 0 ? values.numel() / width : 0;
    rows_seen[name] += rows;
    if (options.sample_rows > 0) stats.samples[name].offer(v, rows, width, options.sample_rows);
    try {
      it->second.add(
          std::span<const float>(values.data<float>(), static_cast<size_t>(values.numel())));
    } catch (const Error& e) {
      throw Error(e.kind(),
                  fmt::format("calibration: {} (input of '{}', step {}): {}", name, ob.node_name,
                              ob.step, e.what()),
                  e.file(), e.line());
    }
  };

  // Greedy, bounded, one beam: the decoder's activations are those generation sees.
  GenerationParams params = default_generation_params(model.desc());
  params.num_beams = 1;
  params.do_sample = false;
  params.max_new_tokens = options.new_tokens;
  params.max_length = 0;
  SchedulerOptions so;
  so.max_batch = static_cast<int>(std::min<int64_t>(options.batch, ir.profile.max_batch));
  model.set_observer(observer);
  struct StopObserving {
    CompiledModel& model;
    ~StopObserving() { model.set_observer({}); }
  } stop{model};
  {
    Scheduler scheduler(model, so);
    std::map<RequestId, size_t> index;
    for (size_t i = 0; i < prompts.size(); ++i) {
      try {
        index[scheduler.submit(ids[i], params)] = i;
      } catch (const Error& e) {
        throw Error(e.kind(), prompts[i].origin + ": " + e.what(), e.file(), e.line());
      }
    }
    Progress progress(log, "calibrating", static_cast<int64_t>(prompts.size()), "prompts");
    size_t done = 0;
    while (done < prompts.size()) {
      for (GenerationEvent& e : scheduler.step()) {
        if (!e.finished) continue;
        const size_t i = index.at(e.id);
        KILN_CHECK(e.error.empty(), "{}: {}", prompts[i].origin, e.error);
        stats.generated_tokens += static_cast<int64_t>(e.result.output_ids.size());
        ++done;
        progress.advance();
      }
    }
    stats.steps = scheduler.steps();
    stats.prompts = static_cast<int64_t>(prompts.size());
    progress.done(
        fmt::format("{} prompts, {} prompt tokens, {} generated tokens, {} steps in "
                    "{:.2f} s",
                    stats.prompts, stats.prompt_tokens, stats.generated_tokens, stats.steps,
                    progress.elapsed_seconds()));
  }
  std::vector<std::string> unseen;
  for (const auto& [name, h] : stats.histograms)
    if (h.count() == 0) unseen.push_back(name);
  KILN_CHECK(unseen.empty(), "calibration: {} tensor(s) were never observed, e.g. {}",
             unseen.size(), unseen.empty() ? "" : unseen.front());
  for (const auto& [name, sums] : abs_sums) {
    std::vector<float>& mean = stats.channel_mean_abs[name];
    const double rows = static_cast<double>(std::max<int64_t>(rows_seen[name], 1));
    for (double s : sums) mean.push_back(static_cast<float>(s / rows));
  }
  return stats;
}

void RowSample::offer(const float* x, int64_t n, int64_t row_width, int64_t capacity) {
  KILN_CHECK(width == 0 || width == row_width, "a sampled tensor has {} channels, then {}", width,
             row_width);
  width = row_width;
  for (int64_t r = 0; r < n; ++r, ++seen) {
    const float* row = x + r * width;
    if (count() < capacity) {
      rows.insert(rows.end(), row, row + width);
      continue;
    }
    // xorshift64: the row replaces a kept one with probability capacity / (seen + 1).
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    const int64_t j = static_cast<int64_t>(rng % static_cast<uint64_t>(seen + 1));
    if (j < capacity) std::copy(row, row + width, rows.begin() + j * width);
  }
}

BuildOptions cpu_float_options(const BuildOptions& options) {
  BuildOptions o = options;
  o.device = Device::kCpu;
  o.precision = Precision::kFp32;
  o.tf32 = false;
  o.precision_options.calibration.reset();
  o.precision_options.calibration_source.clear();
  o.precision_options.smoothing.clear();
  o.precision_options.smoothing_model.clear();
  o.precision_options.smoothing_source.clear();
  return o;
}

CalibrationCache calibrate_model(const ModelIR& model, const ActivationStats& stats,
                                 const CalibrationMethodSpec& method) {
  CalibrationCache cache;
  cache.model = calibration_fingerprint(model);
  cache.method = calibration_method_name(method);
  for (const std::string& name : calibrated_tensors(model)) {
    auto it = stats.histograms.find(name);
    KILN_CHECK(it != stats.histograms.end(), "calibration statistics lack tensor {}", name);
    cache.scales[name] = static_cast<float>(calibrate(it->second, method).scale);
  }
  return cache;
}

CalibrationCache calibrate_checkpoint(Context& ctx, const ModelSource& source,
                                      const BuildOptions& options,
                                      const std::vector<CalibrationPrompt>& prompts,
                                      const CalibrationRunOptions& run,
                                      const CalibrationMethodSpec& method, ActivationStats* stats,
                                      double smoothquant_alpha) {
  KILN_CHECK_USAGE(smoothquant_alpha >= 0.0 && smoothquant_alpha <= 1.0,
                   "--smoothquant {}: alpha must be in (0, 1] (0.5 is a good start)",
                   smoothquant_alpha);
  BuildOptions float_options = cpu_float_options(options);
  const bool smooth = smoothquant_alpha > 0.0;
  // SmoothQuant's factors read the weights as the passes leave them: plain, not packed.
  if (smooth) float_options.pack_for_cpu.reset();
  std::unique_ptr<CompiledModel> model;
  ActivationStats collected;
  auto run_float = [&](const BuildOptions& o, const char* what) {
    model.reset();
    {
      Activity activity(ctx.log(), what);
      model = std::make_unique<CompiledModel>(ctx, build_model(source, o, ctx.log()));
    }
    collected = collect_activation_stats(*model, prompts, run);
  };
  ctx.log().info("calibration: building the fp32 model that the calibration prompts run through");
  run_float(float_options, "building the fp32 model to calibrate");
  std::map<std::string, std::vector<float>> factors;
  if (smooth) {
    factors = smoothquant_factors(model->model(), collected.channel_amax, smoothquant_alpha,
                                  options.precision_options.keep_float);
    ctx.log().info(
        "smoothquant: alpha {}: {} tensors smoothed (their norms divided, their Linears' weight "
        "columns multiplied by the factors); calibrating the smoothed model",
        smoothquant_alpha, factors.size());
    float_options.pack_for_cpu = options.pack_for_cpu;
    float_options.precision_options.smoothing = factors;
    run_float(float_options, "building the smoothed fp32 model");
  }
  CalibrationCache cache = calibrate_model(model->model(), collected, method);
  if (smooth) {
    cache.smoothquant_alpha = smoothquant_alpha;
    cache.smoothing = std::move(factors);
  }
  ctx.log().info("calibration: {} scales ({}), model {}", cache.scales.size(), cache.method,
                 cache.model);
  if (stats) *stats = std::move(collected);
  return cache;
}

AwqResult awq_checkpoint(Context& ctx, const ModelSource& source, const BuildOptions& options,
                         const std::vector<CalibrationPrompt>& prompts,
                         const CalibrationRunOptions& run, int grid) {
  KILN_CHECK_USAGE(options.precision == Precision::kInt4Weight,
                   "AWQ searches the scales of int4-weight plans; this build is --precision {}",
                   precision_name(options.precision));
  KILN_CHECK_USAGE(run.sample_rows >= 1, "AWQ needs sampled rows, got {}", run.sample_rows);
  BuildOptions float_options = cpu_float_options(options);
  float_options.pack_for_cpu.reset();  // the search reads the weights plain
  std::unique_ptr<CompiledModel> model;
  {
    Activity activity(ctx.log(), "building the fp32 model for AWQ's search");
    model = std::make_unique<CompiledModel>(ctx, build_model(source, float_options, ctx.log()));
  }
  const ActivationStats stats = collect_activation_stats(*model, prompts, run);
  std::map<std::string, AwqTensorStats> inputs;
  for (const auto& [name, mean] : stats.channel_mean_abs) {
    AwqTensorStats& t = inputs[name];
    t.channel_mean_abs = mean;
    const auto it = stats.samples.find(name);
    if (it != stats.samples.end()) t.rows = it->second.rows;
  }
  AwqResult result;
  {
    Activity activity(ctx.log(), "AWQ: searching the int4 Linears' input scales");
    result =
        awq_search(model->model(), inputs, options.precision_options.keep_float, grid, &ctx.pool());
  }
  double plain = 0.0, chosen = 0.0;
  for (const auto& [name, c] : result.choices) {
    ctx.log().debug("awq: {}: alpha {:.2f}, output error {:.4g} (unscaled {:.4g}), {} Linears",
                    name, c.alpha, c.error, c.plain_error, c.linears);
    plain += c.plain_error;
    chosen += c.error;
  }
  for (const std::string& why : result.skipped) ctx.log().info("awq: left unscaled: {}", why);
  ctx.log().info(
      "awq: {} of {} Linear inputs scaled ({} sampled rows each); their Linears' squared output "
      "error on those rows {:.4g} -> {:.4g} ({:.1f}% less)",
      result.factors.size(), result.choices.size(), run.sample_rows, plain, chosen,
      plain > 0.0 ? 100.0 * (plain - chosen) / plain : 0.0);
  return result;
}

}  // namespace kiln
