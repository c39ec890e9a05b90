// The public Engine (include/kiln/engine.h) over the runtime's CompiledModel and Scheduler.
#include "kiln/engine.h"

#include "runtime/compiled_model.h"
#include "runtime/scheduler.h"

namespace kiln {

struct Engine::Impl {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompiledModel> model;
  int max_batch = 8;
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::load(const std::string& plan_path, const EngineOptions& options) {
  auto impl = std::make_unique<Impl>();
  ContextOptions o;
  o.threads = options.threads;
  o.log_level = options.verbose ? LogLevel::kInfo : LogLevel::kWarning;
  impl->ctx = std::make_unique<Context>(options_from_environment(o));
  impl->model = CompiledModel::load_plan(*impl->ctx, plan_path);
  impl->max_batch = options.max_batch;
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

std::string Engine::architecture() const { return impl_->model->desc().architecture; }

GenerationParams Engine::default_params() const {
  return default_generation_params(impl_->model->desc());
}

std::vector<int64_t> Engine::encode(const std::string& text) const {
  return impl_->model->tokenizer().encode(text);
}

std::string Engine::decode(const std::vector<int64_t>& ids) const {
  return impl_->model->tokenizer().decode(ids);
}

std::string Engine::apply_template(const std::string& prompt) const {
  return apply_prompt_template(impl_->model->model().prompt_template, prompt);
}

std::vector<TextResult> Engine::generate(const std::vector<std::string>& prompts,
                                         const GenerationParams& params) {
  std::vector<TextResult> out(prompts.size());
  std::vector<std::vector<int64_t>> ids(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    out[i].input_ids = ids[i] = encode(apply_template(prompts[i]));
  SchedulerOptions so;
  so.max_batch = impl_->max_batch;
  Scheduler scheduler(*impl_->model, so);
  std::vector<GenerationResult> results = scheduler.generate(ids, params);
  for (size_t i = 0; i < prompts.size(); ++i) {
    out[i].generation = std::move(results[i]);
    out[i].text = decode(out[i].generation.output_ids);
  }
  return out;
}

}  // namespace kiln
