// The public Engine (include/kiln/engine.h) over the runtime's CompiledModel and one
// GenerationExecutor: every generate() and submit() of every thread goes to the same engine
// thread, which batches them (continuous batching).
#include "kiln/engine.h"

#include "runtime/compiled_model.h"
#include "runtime/generation_executor.h"

namespace kiln {

struct Engine::Impl {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CompiledModel> model;
  std::unique_ptr<GenerationExecutor> executor;  // destroyed first (it steps the model)

  ~Impl() { executor.reset(); }
};

struct Request::Impl {
  GenerationExecutor* executor = nullptr;
  std::shared_ptr<ResponseStream> stream;
  std::vector<int64_t> input_ids;
  std::vector<ResponseChunk> pending;  // read from the stream, not returned yet
  size_t next = 0;                     // the first of pending not returned
  bool done = false;                   // the last chunk was returned

  // The next chunk in order, waiting for it; throws for a request ended by an error or timeout.
  ResponseChunk take() {
    while (next == pending.size()) {
      pending.clear();
      next = 0;
      stream->next(pending);
    }
    ResponseChunk c = std::move(pending[next++]);
    if (c.finished) {
      done = true;
      if (c.cause == EndCause::kError || c.cause == EndCause::kTimeout ||
          c.cause == EndCause::kQueueTimeout)
        throw Error(ErrorKind::kRuntime, "request " + std::to_string(stream->id()) + ": " + c.error,
                    __FILE__, __LINE__);
    }
    return c;
  }
};

Request::Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Request::~Request() {
  if (!impl_->done && !impl_->stream->finished()) impl_->executor->cancel(impl_->stream->id());
}

bool Request::next(TextChunk& chunk) {
  if (impl_->done) return false;
  ResponseChunk c = impl_->take();
  chunk.token_ids = std::move(c.token_ids);
  chunk.text = std::move(c.text);
  chunk.finished = c.finished;
  chunk.finish_reason = c.finish_reason;
  return true;
}

TextResult Request::wait() {
  TextResult r;
  r.input_ids = impl_->input_ids;
  while (!impl_->done) {
    ResponseChunk c = impl_->take();
    r.generation.output_ids.insert(r.generation.output_ids.end(), c.token_ids.begin(),
                                   c.token_ids.end());
    r.text += c.text;
    if (c.finished) {
      r.generation.finish_reason = c.finish_reason;
      r.generation.score = c.score;
    }
  }
  return r;
}

void Request::cancel() { impl_->executor->cancel(impl_->stream->id()); }

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::load(const std::string& plan_path, const EngineOptions& options) {
  KILN_CHECK_USAGE(options.max_batch >= 1, "EngineOptions::max_batch must be at least 1, got {}",
                   options.max_batch);
  auto impl = std::make_unique<Impl>();
  ContextOptions o;
  o.threads = options.threads;
  o.log_level = options.verbose ? LogLevel::kInfo : LogLevel::kWarning;
  impl->ctx = std::make_unique<Context>(options_from_environment(o));
  impl->model = CompiledModel::load_plan(*impl->ctx, plan_path);
  ExecutorOptions eo;
  eo.scheduler.max_batch = options.max_batch;
  eo.max_queue = options.max_queue;
  eo.name = plan_path;
  impl->executor = std::make_unique<GenerationExecutor>(*impl->model, eo);
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

std::unique_ptr<Request> Engine::submit(const std::string& prompt, const GenerationParams& params) {
  auto r = std::make_unique<Request::Impl>();
  r->executor = impl_->executor.get();
  r->input_ids = encode(apply_template(prompt));
  r->stream = impl_->executor->enqueue(r->input_ids, params);
  return std::unique_ptr<Request>(new Request(std::move(r)));
}

std::vector<TextResult> Engine::generate(const std::vector<std::string>& prompts,
                                         const GenerationParams& params) {
  // All queued first, so that they run together; a refusal cancels those already queued (the
  // Requests' destructors).
  std::vector<std::unique_ptr<Request>> requests;
  requests.reserve(prompts.size());
  for (const std::string& p : prompts) requests.push_back(submit(p, params));
  std::vector<TextResult> out;
  out.reserve(prompts.size());
  for (auto& r : requests) out.push_back(r->wait());
  return out;
}

}  // namespace kiln
