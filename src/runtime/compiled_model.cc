#include "runtime/compiled_model.h"

#include <algorithm>
#include <chrono>

#include "plan/plan.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

std::unique_ptr<Tokenizer> make_model_tokenizer(const ModelIR& model, const std::string& source) {
  TokenizerKind kind;
  KILN_CHECK(parse_tokenizer_kind(model.tokenizer_format, &kind),
             "{}: unknown tokenizer format '{}' (expected sentencepiece or byte_level_bpe)", source,
             model.tokenizer_format);
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(kind, model.tokenizer_bytes, source);
  KILN_CHECK(tokenizer->vocab_size() == model.tokenizer_pieces,
             "{}: the {} tokenizer made from the plan's bytes has {} pieces, but the plan recorded "
             "{} at build time (its tokenizer bytes were cut or replaced after `kiln build`); "
             "rebuild the plan",
             source, model.tokenizer_format, tokenizer->vocab_size(), model.tokenizer_pieces);
  return tokenizer;
}

CompiledModel::CompiledModel(Context& ctx, ModelIR model)
    : CompiledModel(ctx, std::move(model), nullptr) {}

CompiledModel::CompiledModel(Context& ctx, ModelIR model, std::unique_ptr<Backend> backend)
    : ctx_(ctx), model_(std::move(model)), backend_(std::move(backend)) {
  check_model_contract(model_, "model");
  auto t = Clock::now();
  if (!backend_) backend_ = make_backend(ctx_, model_.device);
  load_times_.context_ms = ms_since(t);
  // A plan names the kind of device; the backend may be any one of that kind (a GPU's ordinal).
  KILN_CHECK(backend_->device().kind == model_.device.kind, "a {} backend for a {} model",
             device_name(backend_->device()), device_name(model_.device));
  const PrecisionSupport& support = precision_support(model_.device, model_.precision);
  KILN_CHECK_USAGE(support.supported, "the {} backend does not run {} models: {}",
                   device_name(model_.device), precision_name(model_.precision),
                   support.unsupported);
  KILN_CHECK_USAGE(model_.target.empty() || model_.target == backend_->target(),
                   "the plan was built for {}, but this {} is {}: rebuild it on this machine "
                   "(kiln build --device {})",
                   model_.target, backend_->describe(),
                   backend_->target().empty() ? "another target" : backend_->target(),
                   device_name(model_.device));
  const Graph& dec = model_.graph(kDecoderGraph);
  const Graph* enc = model_.desc.encoder_decoder ? &model_.graph(kEncoderGraph) : nullptr;
  t = Clock::now();
  std::vector<const Graph*> graphs = {&dec};
  if (enc != nullptr) graphs.push_back(enc);
  const std::string uploaded = backend_->load_weights(graphs);
  load_times_.weights_ms = ms_since(t);
  t = Clock::now();
  tokenizer_ = make_model_tokenizer(model_, "model tokenizer");
  decoder_ = backend_->compile(dec, model_.profile);
  decoder_io_.input_ids = dec.input_index("input_ids");
  decoder_io_.logit_rows = dec.input_index("logit_rows");
  decoder_io_.logits = dec.output_index("logits");
  if (enc != nullptr) {
    encoder_ = backend_->compile(*enc, model_.profile);
    encoder_io_ = EncoderIo::of(*enc, model_.desc.cache_layers);
  }
  load_times_.compile_ms = ms_since(t);
  if (!uploaded.empty()) ctx_.log().info("{}", uploaded);
  ctx_.log().info("engine ready on {} (context {:.0f} ms, weights {:.0f} ms, compile {:.0f} ms)",
                  backend_->describe(), load_times_.context_ms, load_times_.weights_ms,
                  load_times_.compile_ms);
}

std::unique_ptr<CompiledModel> CompiledModel::load_plan(Context& ctx, const std::string& path) {
  const auto t = Clock::now();
  ModelIR model = read_plan(path, ctx.log());
  const double read_ms = ms_since(t);
  auto compiled = std::make_unique<CompiledModel>(ctx, std::move(model));
  compiled->load_times_.read_ms = read_ms;
  return compiled;
}

DType CompiledModel::kv_cache_dtype() {
  DType compute = DType::kF32;
  for (const Node& n : model_.graph(kDecoderGraph).nodes)
    if (n.op == OpKind::kAttention && n.attr<AttentionAttrs>().kind == AttentionKind::kCachedSelf) {
      compute = model_.graph(kDecoderGraph).values[n.inputs[0]].dtype;
      break;
    }
  return backend_->kv_cache_dtype(compute, model_.precision, model_.kv_cache);
}

Executable& CompiledModel::encoder() {
  KILN_CHECK(encoder_ != nullptr, "this model has no encoder");
  return *encoder_;
}

void CompiledModel::set_observer(const ActivationObserver& observer) {
  std::vector<std::string> found;
  auto set = [&](Executable* exec, const char* graph_name) {
    if (exec == nullptr) return;
    ActivationObserver own = observer;
    own.selection.names = names_in_graph(model_.graph(graph_name), observer.selection.names);
    found.insert(found.end(), own.selection.names.begin(), own.selection.names.end());
    exec->set_observer(std::move(own));
  };
  set(encoder_.get(), kEncoderGraph);
  set(decoder_.get(), kDecoderGraph);
  for (const std::string& name : observer.selection.names)
    KILN_CHECK(std::find(found.begin(), found.end(), name) != found.end(),
               "no node named '{}' to observe in the model's graphs", name);
}

}  // namespace kiln
