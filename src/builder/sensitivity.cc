#include "builder/sensitivity.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include "builder/calibration_runner.h"

#include "builder/calibration_runner.h"
#include "core/logging.h"
#include "graph/packing.h"
#include "passes/pass.h"
#include "runtime/forced_logits.h"
#include "runtime/scheduler.h"

namespace kiln {
namespace {

// The scored positions' log-probabilities of the fp32 plan, and the sequences they came from.
struct Reference {
  std::vector<ForcedSequence> sequences;
  std::vector<Tensor> log_probs;  // per sequence [rows, vocab]
  int64_t positions = 0;
};

// Row-wise log-softmax of f32 logits [rows, vocab], in place.
void log_softmax_rows(Tensor& t) {
  const int64_t rows = t.dim(0), vocab = t.dim(1);
  float* p = t.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = p + r * vocab;
    float mx = row[0];
    for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
    const float lse = mx + static_cast<float>(std::log(sum));
    for (int64_t j = 0; j < vocab; ++j) row[j] -= lse;
  }
}

int64_t argmax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

// Quiets the context's log (INFO of every pass and compile of every plan measured) while alive.
class QuietLog {
 public:
  explicit QuietLog(Logger& log) : log_(log), level_(log.level()) {
    log_.set_level(std::max(level_, LogLevel::kWarning));
  }
  ~QuietLog() { log_.set_level(level_); }
  QuietLog(const QuietLog&) = delete;
  QuietLog& operator=(const QuietLog&) = delete;

 private:
  Logger& log_;
  LogLevel level_;
};

// The fp32 plan generates greedily from each prompt; the prompt and what it generated are the
// sequence every plan is scored on, at the positions that predict the generated tokens and the
// one after (EOS, or the next token).
Reference make_reference(CompiledModel& model, const std::vector<CalibrationPrompt>& prompts,
                         int64_t new_tokens) {
  const ModelIR& ir = model.model();
  const ModelDesc& desc = model.desc();
  Reference ref;
  std::vector<std::vector<int64_t>> ids(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids[i] = model.tokenizer().encode(apply_prompt_template(ir.prompt_template, prompts[i].text));
    KILN_CHECK_USAGE(static_cast<int64_t>(ids[i].size()) <= ir.profile.max_input_tokens,
                     "{}: the prompt is {} tokens; the plan allows at most {}", prompts[i].origin,
                     ids[i].size(), ir.profile.max_input_tokens);
    KILN_CHECK_USAGE(!ids[i].empty(), "{}: the prompt has no tokens", prompts[i].origin);
  }
  GenerationParams params = default_generation_params(desc);
  params.num_beams = 1;
  params.do_sample = false;
  params.max_new_tokens = new_tokens;
  params.max_length = 0;
  std::vector<std::vector<int64_t>> outputs(prompts.size());
  {
    SchedulerOptions so;
    so.max_batch = static_cast<int>(std::min<int64_t>(16, ir.profile.max_batch));
    Scheduler scheduler(model, so);
    std::map<RequestId, size_t> index;
    for (size_t i = 0; i < prompts.size(); ++i) index[scheduler.submit(ids[i], params)] = i;
    size_t done = 0;
    while (done < prompts.size())
      for (GenerationEvent& e : scheduler.step()) {
        if (!e.finished) continue;
        const size_t i = index.at(e.id);
        KILN_CHECK(e.error.empty(), "{}: {}", prompts[i].origin, e.error);
        outputs[i] = std::move(e.result.output_ids);
        ++done;
      }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    ForcedSequence s;
    if (desc.encoder_decoder) {
      s.prompt = ids[i];
      s.decoder_ids = {desc.decoder_start_token_id};
    } else {
      s.decoder_ids = ids[i];
      s.first_row = static_cast<int64_t>(ids[i].size()) - 1;
    }
    s.decoder_ids.insert(s.decoder_ids.end(), outputs[i].begin(), outputs[i].end());
    // The plan's steps bound the sequence; generation stays within the positions.
    const int64_t n =
        std::min<int64_t>(static_cast<int64_t>(s.decoder_ids.size()), ir.profile.max_step_tokens);
    s.decoder_ids.resize(static_cast<size_t>(n));
    // At most a step's logits rows: the last ones.
    s.first_row = std::max(s.first_row, n - ir.profile.max_batch);
    ref.sequences.push_back(std::move(s));
  }
  ref.log_probs = forced_logits(model, ref.sequences);
  for (Tensor& lp : ref.log_probs) {
    log_softmax_rows(lp);
    ref.positions += lp.dim(0);
  }
  return ref;
}

// Mean KL(reference || plan) and top-1 agreement of `model` on the reference's sequences.
LayerSensitivity score(CompiledModel& model, const Reference& ref) {
  double kl_sum = 0.0;
  int64_t agree = 0;
  std::vector<Tensor> logits = forced_logits(model, ref.sequences);
  for (size_t s = 0; s < ref.sequences.size(); ++s) {
    Tensor& q = logits[s];
    log_softmax_rows(q);
    const Tensor& p = ref.log_probs[s];
    const int64_t rows = p.dim(0), vocab = p.dim(1);
    KILN_CHECK(q.dim(0) == rows && q.dim(1) == vocab, "sensitivity: logits [{}, {}] vs [{}, {}]",
               q.dim(0), q.dim(1), rows, vocab);
    for (int64_t r = 0; r < rows; ++r) {
      const float* lp = p.data<float>() + r * vocab;
      const float* lq = q.data<float>() + r * vocab;
      double kl = 0.0;
      for (int64_t j = 0; j < vocab; ++j) {
        const double pj = std::exp(static_cast<double>(lp[j]));
        if (pj > 0.0) kl += pj * (static_cast<double>(lp[j]) - static_cast<double>(lq[j]));
      }
      kl_sum += std::max(kl, 0.0);  // rounding can make a zero KL slightly negative
      agree += argmax(lp, vocab) == argmax(lq, vocab);
    }
  }
  const double n = static_cast<double>(std::max<int64_t>(ref.positions, 1));
  return {kl_sum / n, static_cast<double>(agree) / n};
}

// Builds and scores int8 plans of one imported model with chosen layers kept float.
class PlanScorer {
 public:
  PlanScorer(Context& ctx, const ModelIR& base, const BuildOptions& options, const Reference& ref)
      : ctx_(ctx), base_(base), options_(options), ref_(ref) {}

  // The int8 plan with `float_nodes` kept float.
  ModelIR build(const std::set<std::string>& float_nodes) {
    BuildOptions o = options_;
    CalibrationCache& cache = *o.precision_options.calibration;
    cache.fallback.clear();
    for (const std::string& n : float_nodes) cache.fallback[n] = {};
    // Packed below, reusing what earlier plans packed.
    o.pack_for_cpu.reset();
    ModelIR model = base_;
    QuietLog quiet(ctx_.log());
    finish_build(model, o, ctx_.log());
    if (model.device == Device::kCpu && options_.pack_for_cpu == CpuIsa::kAvx512)
      pack_reusing(model);
    return model;
  }

  LayerSensitivity score_plan(const std::set<std::string>& float_nodes) {
    ModelIR model = build(float_nodes);
    std::unique_ptr<CompiledModel> compiled;
    {
      QuietLog quiet(ctx_.log());
      compiled = std::make_unique<CompiledModel>(ctx_, std::move(model));
    }
    ++measured_;
    return score(*compiled, ref_);
  }
  int measured() const { return measured_; }

 private:
  // pack_weights, except that a weight an earlier plan packed from the same tensor (one the
  // plans share with the imported model: every weight the plan keeps f32) takes that packed
  // form: each plan then packs only what it quantized, not the whole model again (on the CPU a
  // plain weight would be packed when the plan is compiled, every plan).
  void pack_reusing(ModelIR& model) {
    std::map<std::string, Tensor> plain;  // graph/value -> the data before packing
    for (Graph& g : model.graphs)
      for (size_t id = 0; id < g.values.size(); ++id) {
        Value& v = g.values[id];
        if (v.kind != ValueKind::kWeight || !v.layout.plain() || !v.data.defined()) continue;
        const std::string key = g.name + "/" + v.name;
        const auto it = packed_.find(key);
        if (it != packed_.end() && it->second.source.raw() == v.data.raw() &&
            it->second.source.dtype() == v.data.dtype() &&
            it->second.source.shape() == v.data.shape()) {
          g.set_weight_data(static_cast<int>(id), it->second.packed);
          v.layout = it->second.layout;
          model.target = kPanel16Target;
        } else {
          plain[key] = v.data;
        }
      }
    pack_weights(model, ctx_.log());
    for (const Graph& g : model.graphs)
      for (const Value& v : g.values) {
        const auto it = plain.find(g.name + "/" + v.name);
        if (it != plain.end() && !v.layout.plain())
          packed_[it->first] = {it->second, v.data, v.layout};
      }
  }

  struct Packed {
    Tensor source;  // kept alive, so that no later tensor takes its address
    Tensor packed;
    WeightLayout layout;
  };
  std::map<std::string, Packed> packed_;
  Context& ctx_;
  const ModelIR& base_;
  const BuildOptions& options_;
  const Reference& ref_;
  int measured_ = 0;
};

// The layers of an int8 plan: each quantized weight matrix and the nodes reading it.
std::vector<LayerMeasurement> quantized_layers(const ModelIR& plan) {
  std::vector<LayerMeasurement> layers;
  std::map<std::string, size_t> index;  // graph/weight -> layer
  for (const Graph& g : plan.graphs)
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kLinear && n.op != OpKind::kEmbedding) continue;
      const Value& w = g.values[static_cast<size_t>(n.inputs[n.op == OpKind::kLinear ? 1 : 0])];
      if (w.dtype != DType::kI8 && w.dtype != DType::kI4) continue;
      const std::string key = g.name + "/" + w.name;
      auto [it, added] = index.emplace(key, layers.size());
      if (added) layers.push_back({{}, key, {}});
      layers[it->second].nodes.push_back(n.name);
    }
  return layers;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : " + ") + n;
  return s;
}

}  // namespace

std::optional<double> parse_quant_tolerance(const std::string& text) {
  if (text == "off") return std::nullopt;
  double value = 0.0;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  KILN_CHECK_USAGE(!text.empty() && err == std::errc() && end == text.data() + text.size(),
                   "--quant-tolerance '{}': expected a mean KL divergence in nats per token (a "
                   "number >= 0, e.g. {:g}) or 'off'",
                   text, kDefaultQuantTolerance);
  SensitivityOptions o;
  o.tolerance = value;
  check_sensitivity_options(o);
  return value;
}

void check_sensitivity_options(const SensitivityOptions& options) {
  KILN_CHECK_USAGE(std::isfinite(options.tolerance) && options.tolerance >= 0.0,
                   "--quant-tolerance {}: the tolerance is a mean KL divergence in nats per token "
                   "(>= 0, e.g. {:g}), or 'off' to keep every layer int8",
                   options.tolerance, kDefaultQuantTolerance);
  KILN_CHECK_USAGE(options.prompts >= 1,
                   "--sensitivity-prompts {}: the sensitivity pass needs at least 1 prompt "
                   "(default {}); --quant-tolerance off skips it",
                   options.prompts, kDefaultSensitivityPrompts);
  KILN_CHECK_USAGE(options.new_tokens >= 1,
                   "the sensitivity pass scores at least 1 generated token per prompt, got {}",
                   options.new_tokens);
}

CalibrationCache apply_sensitivity_fallback(Context& ctx, const ModelSource& source,
                                            const BuildOptions& options,
                                            const std::vector<CalibrationPrompt>& prompts,
                                            const SensitivityOptions& sensitivity,
                                            SensitivityReport* report_out) {
  check_sensitivity_options(sensitivity);
  KILN_CHECK_USAGE(precision_support(options.device, options.precision).calibrated_inputs &&
                       options.precision_options.calibration.has_value(),
                   "the sensitivity fallback measures a calibrated int8 (W8A8) build; this one "
                   "is --precision {}{}",
                   precision_name(options.precision),
                   options.precision_options.calibration ? "" : " without a calibration");
  KILN_CHECK_USAGE(!prompts.empty(), "the sensitivity fallback needs calibration prompts");
  const auto t0 = std::chrono::steady_clock::now();
  const Logger& log = ctx.log();
  SensitivityReport report;
  const std::vector<CalibrationPrompt> scored(
      prompts.begin(), prompts.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(
                                             prompts.size(), sensitivity.prompts)));
  report.prompts = static_cast<int64_t>(scored.size());

  // The fp32 plan (no smoothing: the model itself) and what it predicts.
  BuildOptions float_options = cpu_float_options(options);
  float_options.spill_dir.clear();
  Reference ref;
  {
    Activity activity(log, "sensitivity: running the fp32 plan on the scored prompts");
    std::unique_ptr<CompiledModel> fp32;
    {
      QuietLog quiet(ctx.log());
      fp32 = std::make_unique<CompiledModel>(ctx, build_model(source, float_options, ctx.log()));
    }
    ref = make_reference(*fp32, scored, sensitivity.new_tokens);
  }
  report.positions = ref.positions;

  // One import of the int8 build; every plan measured finishes a copy of it.
  // A cuda build's layers are measured on the CPU's int8 plan: the same graph up to the precision
  // pass, the same calibrated scales and the same quantization (graph/linear.h); its
  // activations between the Linears are f32 where the GPU's are fp16.
  // An fp8 build's layers are ranked by their int8 (W8A8) error there: no fp8 kernel runs on the
  // CPU, and both quantize each Linear input with one static scale from the same thresholds.
  BuildOptions int8_options = options;
  if (int8_options.device != Device::kCpu) {
    int8_options.device = Device::kCpu;
    int8_options.tf32 = false;
    int8_options.precision = Precision::kInt8;
    log.info("sensitivity: the {} {} build's layers are measured on the cpu's int8 (W8A8) plan",
             device_name(options.device), precision_name(options.precision));
  }
  int8_options.spill_dir.clear();
  int8_options.precision_options.calibration->quant_tolerance = sensitivity.tolerance;
  ModelIR base;
  {
    QuietLog quiet(ctx.log());
    base = import_for_precision(source, int8_options, ctx.log());
  }
  PlanScorer scorer(ctx, base, int8_options, ref);
  report.layers = quantized_layers(scorer.build({}));
  std::set<std::string> all_nodes;
  for (const LayerMeasurement& l : report.layers) all_nodes.insert(l.nodes.begin(), l.nodes.end());
  log.info(
      "sensitivity: {} quantized layers, each measured alone against fp32 on {} prompts ({} "
      "next-token positions; mean KL in nats and top-1 agreement)",
      report.layers.size(), report.prompts, report.positions);
  {
    Progress progress(log, "sensitivity", static_cast<int64_t>(report.layers.size()), "layers");
    for (LayerMeasurement& layer : report.layers) {
      std::set<std::string> others = all_nodes;
      for (const std::string& n : layer.nodes) others.erase(n);
      layer.error = scorer.score_plan(others);
      progress.advance();
    }
    progress.done(fmt::format("{} layers measured in {:.2f} s", report.layers.size(),
                              progress.elapsed_seconds()));
  }
  std::stable_sort(report.layers.begin(), report.layers.end(),
                   [](const LayerMeasurement& a, const LayerMeasurement& b) {
                     if (a.error.mean_kl != b.error.mean_kl)
                       return a.error.mean_kl > b.error.mean_kl;
                     return a.error.top1_agreement < b.error.top1_agreement;
                   });

  // The fewest worst layers in float that bring the whole plan under the tolerance.
  const size_t n = report.layers.size();
  std::map<size_t, LayerSensitivity> measured;  // layers kept -> the whole plan's error
  auto whole = [&](size_t kept) -> const LayerSensitivity& {
    auto it = measured.find(kept);
    if (it != measured.end()) return it->second;
    std::set<std::string> nodes;
    for (size_t i = 0; i < kept; ++i)
      nodes.insert(report.layers[i].nodes.begin(), report.layers[i].nodes.end());
    const LayerSensitivity e = scorer.score_plan(nodes);
    log.info("sensitivity: {} of {} layers kept float: mean KL {:.3g}, top-1 agreement {:.2f} %",
             kept, n, e.mean_kl, 100.0 * e.top1_agreement);
    return measured.emplace(kept, e).first->second;
  };
  auto passes = [&](size_t kept) { return whole(kept).mean_kl <= sensitivity.tolerance; };
  size_t chosen = 0;
  {
    Activity activity(log, "sensitivity: choosing the layers to keep float");
    if (!passes(0)) {
      // Exponential steps to a count under the tolerance, then bisection below it.
      size_t low = 0, high = std::min<size_t>(1, n);
      while (high < n && !passes(high)) {
        low = high;
        high = std::min(n, high * 2);
      }
      if (!passes(high)) {
        log.warn(
            "sensitivity: even with every layer float the mean KL is {:.3g}, above "
            "--quant-tolerance {:g}: every quantized layer stays float",
            whole(high).mean_kl, sensitivity.tolerance);
        chosen = high;
      } else {
        while (high - low > 1) {
          const size_t mid = low + (high - low) / 2;
          (passes(mid) ? high : low) = mid;
        }
        chosen = high;
      }
    }
  }
  report.kept = chosen;
  report.all_int8 = whole(0);
  report.chosen = whole(chosen);
  report.plans_measured = scorer.measured();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  for (size_t i = 0; i < n; ++i) {
    const LayerMeasurement& l = report.layers[i];
    log.info("sensitivity: {:<48} mean KL {:<10.3g} top-1 {:6.2f} %{}", joined(l.nodes),
             l.error.mean_kl, 100.0 * l.error.top1_agreement, i < chosen ? "  kept float" : "");
  }
  log.info(
      "sensitivity: {} of {} layers kept float: mean KL {:.3g} (all int8: {:.3g}), top-1 "
      "agreement {:.2f} % (all int8: {:.2f} %), --quant-tolerance {:g}; {} plans measured on {} "
      "prompts ({} positions) in {:.2f} s",
      chosen, n, report.chosen.mean_kl, report.all_int8.mean_kl,
      100.0 * report.chosen.top1_agreement, 100.0 * report.all_int8.top1_agreement,
      sensitivity.tolerance, report.plans_measured, report.prompts, report.positions,
      report.seconds);

  CalibrationCache cache = *options.precision_options.calibration;
  cache.quant_tolerance = sensitivity.tolerance;
  cache.fallback.clear();
  for (size_t i = 0; i < chosen; ++i)
    for (const std::string& node : report.layers[i].nodes)
      cache.fallback[node] = report.layers[i].error;
  if (report_out) *report_out = std::move(report);
  return cache;
}

}  // namespace kiln
