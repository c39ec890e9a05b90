// A model ready to run: its ModelIR (from a plan, or built in memory by the builder), its
// tokenizer, the backend for its device and the compiled graphs, with graph inputs and outputs
// resolved to positions once. The runtime links no frontend or pass: loading a plan is all it
// needs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/context.h"
#include "graph/model_ir.h"
#include "runtime/encoder_run.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

class CompiledModel {
 public:
  // Compiles the graphs on the backend of model.device; throws naming what is unsupported.
  CompiledModel(Context& ctx, ModelIR model);
  // The same on a backend the caller made for model.device (a wrapper around another one, e.g.
  // in tests).
  CompiledModel(Context& ctx, ModelIR model, std::unique_ptr<Backend> backend);
  // Reads a plan (weights mmapped, not copied) and compiles it.
  static std::unique_ptr<CompiledModel> load_plan(Context& ctx, const std::string& path);

  Context& context() { return ctx_; }
  const ModelIR& model() const { return model_; }
  const ModelDesc& desc() const { return model_.desc; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  Backend& backend() { return *backend_; }
  Executable& encoder();  // encoder-decoder models only
  Executable& decoder() { return *decoder_; }
  // The type the paged KV cache stores: the one the decoder's cached self attention computes in
  // (the plan's precision), or the one the backend narrows it to (the CPU's narrow plans: bf16;
  // --kv-cache fp8: E4M3).
  DType kv_cache_dtype();
  // Observes both graphs (Executable::set_observer): each executable gets the selection with
  // the names its own graph has, and the callback tells them apart by Observation::graph.
  // Throws naming a selected name that neither graph has. Without a callback: stops.
  void set_observer(const ActivationObserver& observer);
  // The activation workspaces the graphs allocated so far (Executable::workspace_bytes).
  int64_t workspace_bytes() const {
    return (encoder_ != nullptr ? encoder_->workspace_bytes() : 0) + decoder_->workspace_bytes();
  }

  // Where the load's time went, in ms. context: making the backend (on CUDA, the CUDA context,
  // cuBLASLt and their workspaces: paid once per process and device, not per plan); read: the
  // plan file (load_plan only); weights: moving them to the device (Backend::load_weights);
  // compile: the tokenizer and the graphs' executables.
  struct LoadTimes {
    double context_ms = 0;
    double read_ms = 0;
    double weights_ms = 0;
    double compile_ms = 0;
    double plan_ms() const { return read_ms + weights_ms + compile_ms; }
  };
  const LoadTimes& load_times() const { return load_times_; }

  // Positions of the contract's inputs and outputs (graph/model_ir.h), resolved once.
  struct DecoderIo {
    int input_ids = -1;
    int logit_rows = -1;
    int logits = -1;
  };
  const EncoderIo& encoder_io() const { return encoder_io_; }
  const DecoderIo& decoder_io() const { return decoder_io_; }

 private:
  Context& ctx_;
  ModelIR model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Executable> encoder_;
  std::unique_ptr<Executable> decoder_;
  EncoderIo encoder_io_;
  DecoderIo decoder_io_;
  LoadTimes load_times_;
};

// The tokenizer a model carries (its stored format and bytes).
std::unique_ptr<Tokenizer> make_model_tokenizer(const ModelIR& model, const std::string& source);

}  // namespace kiln
