#include "kiln/engine.h"

#include "frontend/hf/frontend.h"
#include "io/plan.h"
#include "passes/pass.h"

namespace kiln {

ModelIR build_model(const std::string& hf_dir, const BuildOptions& options, const Logger& log) {
  KILN_CHECK_USAGE(options.device == Device::kCpu,
                   "--device {}: this build of kiln compiles plans for the cpu only",
                   device_name(options.device));
  KILN_CHECK_USAGE(options.precision == DType::kF32,
                   "--precision {}: only fp32 plans are implemented so far",
                   dtype_name(options.precision));
  check_prompt_template(options.prompt_template);
  ModelIR model = import_hf_model(hf_dir, log);
  model.prompt_template = options.prompt_template;
  if (options.max_input_tokens > 0) {
    model.max_input_tokens = options.max_input_tokens;
  } else {
    switch (model.config.arch) {
      case Architecture::kT5:
        model.max_input_tokens = 512;
        break;
      case Architecture::kBloom:
        model.max_input_tokens = 2048;
        break;
    }
  }
  if (options.optimize) {
    optimize_model(model, PassOptions{}, log);
  } else {
    // Without the pipeline the Cast nodes of fp16 checkpoints still need resolving for the cpu.
    for (Graph& g : model.graphs) {
      fold_constants(g, log);
      eliminate_dead(g, log);
    }
  }
  return model;
}

Engine::Engine(Context& ctx, ModelIR model) : ctx_(ctx), model_(std::move(model)) {
  check_model_contract(model_, "model");
  tokenizer_ = make_tokenizer(model_.tokenizer_kind, model_.tokenizer_bytes, "model tokenizer");
  backend_ = make_cpu_backend(ctx_);
  if (model_.is_encoder_decoder()) encoder_ = backend_->compile(model_.graph(kEncoderGraph));
  decoder_ = backend_->compile(model_.graph(kDecoderGraph));
  ctx_.log().info("engine ready on {}", backend_->describe());
}

std::unique_ptr<Engine> Engine::from_plan(Context& ctx, const std::string& path) {
  return std::make_unique<Engine>(ctx, read_plan(path, ctx.log()));
}

std::unique_ptr<Engine> Engine::from_model_dir(Context& ctx, const std::string& dir,
                                               const BuildOptions& options) {
  return std::make_unique<Engine>(ctx, build_model(dir, options, ctx.log()));
}

Executable& Engine::encoder() {
  KILN_CHECK(encoder_ != nullptr, "this model has no encoder");
  return *encoder_;
}

Executable& Engine::decoder() { return *decoder_; }

}  // namespace kiln
