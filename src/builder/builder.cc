#include "builder/builder.h"

#include "backend/backend.h"
#include "frontend/hf/frontend.h"
#include "passes/pass.h"

namespace kiln {

ModelIR build_model(const std::string& hf_dir, const BuildOptions& options, const Logger& log) {
  const std::string why = target_unsupported_reason(options.device, options.precision);
  KILN_CHECK_USAGE(why.empty(), "--device {} --precision {}: {}", device_name(options.device),
                   precision_name(options.precision), why);
  check_prompt_template(options.prompt_template);
  KILN_CHECK_USAGE(options.max_input_tokens >= 0, "--max-input-tokens must be positive, got {}",
                   options.max_input_tokens);
  KILN_CHECK_USAGE(options.max_batch >= 1 && options.max_batch <= 1024,
                   "the plan's batch size must be in 1..1024, got {}", options.max_batch);
  ModelIR model = import_hf_model(hf_dir, log);
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
  p.max_step_tokens = std::max<int64_t>(p.max_input_tokens, options.max_batch);
  p.max_batch = options.max_batch;
  p.token_buckets = ShapeProfile::default_buckets(p.max_step_tokens);
  if (options.optimize) {
    PassOptions passes;
    passes.precision = options.precision;
    optimize_model(model, passes, log);
  } else {
    // Without the pipeline the Cast nodes of fp16 checkpoints still need resolving, and the
    // executor needs slots.
    for (Graph& g : model.graphs) {
      fold_constants(g, log);
      eliminate_dead(g, log);
      if (model.device == Device::kCuda)
        narrow_graph(g, model.precision, log);
      else
        assign_precision(g, model.precision, &model.precision_notes, log);
    }
  }
  if (model.device == Device::kCpu && options.pack_for_cpu == CpuIsa::kAvx512)
    pack_weights(model, log);
  return model;
}

std::unique_ptr<CompiledModel> compile_model_dir(Context& ctx, const std::string& hf_dir,
                                                 const BuildOptions& options) {
  return std::make_unique<CompiledModel>(ctx, build_model(hf_dir, options, ctx.log()));
}

}  // namespace kiln
