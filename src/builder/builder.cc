#include "builder/builder.h"

#include <optional>

#include "backend/backend.h"
#include "frontend/hf/frontend.h"
#include "frontend/onnx/onnx_frontend.h"
#include "io/weight_spill.h"
#include "passes/pass.h"

namespace kiln {

namespace {

// What every build checks before importing anything.
void check_build_options(const BuildOptions& options) {
  const std::string why = target_unsupported_reason(options.device, options.precision);
  KILN_CHECK_USAGE(why.empty(), "--device {} --precision {}: {}", device_name(options.device),
                   precision_name(options.precision), why);
  const std::string_view kv_refusal = kv_cache_refusal(options.device, options.kv_cache);
  KILN_CHECK_USAGE(kv_refusal.empty(), "--device {} --kv-cache {}: {}", device_name(options.device),
                   kv_cache_name(options.kv_cache), kv_refusal);
  check_prompt_template(options.prompt_template);
  // An int8 build without calibration data fails now, before any work; the cache itself is
  // checked against the model after the passes that precede the precision pass.
  require_calibration(options.device, options.precision, options.precision_options);
  KILN_CHECK_USAGE(options.max_input_tokens >= 0, "--max-input-tokens must be positive, got {}",
                   options.max_input_tokens);
  KILN_CHECK_USAGE(options.max_batch >= 1 && options.max_batch <= 1024,
                   "the plan's batch size must be in 1..1024, got {}", options.max_batch);
  KILN_CHECK_USAGE(
      !options.tf32 || (options.device == Device::kCuda && options.precision == Precision::kFp32),
      "--tf32 is for --device cuda --precision fp32 (TF32 tensor cores run fp32 "
      "GEMMs with 10-bit mantissas); got --device {} --precision {}",
      device_name(options.device), precision_name(options.precision));
}

// An imported model's target and shape profile, and the passes before the precision pass.
void prepare_for_precision(ModelIR& model, const BuildOptions& options, const Logger& log) {
  model.device = options.device;
  if (model.device == Device::kCuda) {
    model.target = cuda_build_target();
    const CudaInfo gpu = query_cuda();
    log.info("target {} ({})", model.target,
             gpu.first_sm > 0
                 ? gpu.first_device
                 : "no GPU visible: the architecture kiln's CUDA kernels are built for");
  }
  model.precision = options.precision;
  model.kv_cache = options.kv_cache;
  model.prompt_template = options.prompt_template;
  ShapeProfile& p = model.profile;
  if (options.max_input_tokens > 0) {
    p.max_input_tokens = options.max_input_tokens;
  } else {
    p.max_input_tokens = model.desc.max_positions;
    log.info("max input tokens: {} (the model's positions; set --max-input-tokens to change)",
             p.max_input_tokens);
  }
  // The encoder runs a whole prompt in one step, so a step must hold the longest prompt.
  KILN_CHECK_USAGE(options.max_step_tokens >= 0 && options.max_step_tokens <= 1 << 20,
                   "--max-step-tokens must be in 1..{}, got {}", 1 << 20, options.max_step_tokens);
  if (options.max_step_tokens > 0) {
    p.max_step_tokens = std::max<int64_t>(options.max_step_tokens, p.max_input_tokens);
    if (p.max_step_tokens > options.max_step_tokens)
      log.info(
          "max step tokens: {} (raised to the longest prompt: T5 encodes a prompt in one "
          "step)",
          p.max_step_tokens);
  } else {
    p.max_step_tokens = std::max<int64_t>(p.max_input_tokens, options.max_batch);
    if (options.device == Device::kCuda)
      p.max_step_tokens = std::max(p.max_step_tokens, kCudaStepTokens);
  }
  // A step gives each sequence at least one token.
  p.max_batch = std::min(options.max_batch, p.max_step_tokens);
  if (p.max_batch < options.max_batch)
    log.info("max batch: {} (a step of {} tokens runs at most that many sequences)", p.max_batch,
             p.max_step_tokens);
  p.token_buckets = ShapeProfile::default_buckets(p.max_step_tokens);
  if (options.optimize) {
    PassOptions passes;
    passes.precision = options.precision_options;
    optimize_before_precision(model, passes, log);
  } else {
    // Without the pipeline the Cast nodes of fp16 checkpoints still need resolving, and the
    // executor needs slots.
    for (Graph& g : model.graphs) {
      fold_constants(g, log);
      eliminate_dead(g, log);
    }
  }
}

}  // namespace

ModelSource ModelSource::onnx(std::vector<std::string> files, std::string tokenizer_file) {
  ModelSource s(std::string{});
  s.onnx_files = std::move(files);
  s.tokenizer = std::move(tokenizer_file);
  return s;
}

std::string ModelSource::label() const {
  return is_onnx() ? fmt::format("{}", fmt::join(onnx_files, " + ")) : hf_dir;
}

ModelIR import_for_precision(const ModelSource& source, const BuildOptions& options,
                             const Logger& log) {
  check_build_options(options);
  ModelIR model = source.is_onnx() ? import_onnx_model(source.onnx_files, source.tokenizer, log)
                                   : import_hf_model(source.hf_dir, log);
  prepare_for_precision(model, options, log);
  return model;
}

void finish_build(ModelIR& model, const BuildOptions& options, const Logger& log) {
  if (options.optimize) {
    PassOptions passes;
    passes.precision = options.precision_options;
    optimize_from_precision(model, passes, log);
  } else {
    check_calibration(model, options.precision_options);
    apply_smoothing(model, options.precision_options, log);
    for (Graph& g : model.graphs) {
      assign_precision(g, precision_support(model.device, model.precision),
                       options.precision_options, &model.precision_notes, log);
    }
  }
  if (options.tf32) {
    int linears = 0;
    for (Graph& g : model.graphs)
      for (Node& n : g.nodes)
        if (n.op == OpKind::kLinear && g.values[n.outputs[0]].dtype == DType::kF32) {
          n.attr<LinearAttrs>().tf32 = true;
          ++linears;
        }
    log.info(
        "tf32: {} fp32 linears may use TF32 tensor cores (about 1e-3 relative error; "
        "norms, softmax and accumulation stay fp32)",
        linears);
  }
  if (model.device == Device::kCpu && options.pack_for_cpu == CpuIsa::kAvx512)
    pack_weights(model, log);
}

ModelIR build_model(const std::string& hf_dir, const BuildOptions& options, const Logger& log) {
  return build_model(ModelSource(hf_dir), options, log);
}

ModelIR build_model_from_onnx(const std::vector<std::string>& onnx_files,
                              const std::string& tokenizer_file, const BuildOptions& options,
                              const Logger& log) {
  return build_model(ModelSource::onnx(onnx_files, tokenizer_file), options, log);
}

ModelIR build_model(const ModelSource& source, const BuildOptions& options, const Logger& log) {
  std::optional<WeightSpill::Scope> spill;
  if (!options.spill_dir.empty()) spill.emplace(WeightSpill::create(options.spill_dir));
  ModelIR model = import_for_precision(source, options, log);
  finish_build(model, options, log);
  return model;
}

void select_tactics(ModelIR& model, Context& ctx) {
  if (model.device != Device::kCuda) return;
  const CudaInfo gpu = query_cuda();
  if (gpu.device_count == 0) {
    ctx.log().info(
        "tactics: no GPU visible, so none are timed: kernels are chosen when the plan loads "
        "(GEMV for up to 5 rows, cuBLASLt's heuristic above). Build on the GPU to time them.");
    return;
  }
  const std::unique_ptr<Backend> backend = make_backend(ctx, Device::kCuda);
  for (Graph& g : model.graphs) backend->select_tactics(g, model.profile);
}

std::unique_ptr<CompiledModel> compile_model_dir(Context& ctx, const std::string& hf_dir,
                                                 const BuildOptions& options) {
  return std::make_unique<CompiledModel>(ctx, build_model(hf_dir, options, ctx.log()));
}

}  // namespace kiln
