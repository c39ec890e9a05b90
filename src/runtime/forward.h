// One sequence's full forward pass through a model's compiled graphs, without the scheduler:
// the logits of every decoder position, the way HuggingFace's forward computes them, optionally
// one token per decoder call through the paged KV cache. `kiln exec --plan` and the parity
// tests drive plans with it.
#pragma once

#include <vector>

#include "runtime/compiled_model.h"
#include "runtime/encoder_run.h"

namespace kiln {

struct Forward {
  Tensor encoder_hidden;  // [prompt tokens, d_model], encoder-decoder models only
  Tensor logits;          // [decoder tokens, vocab] f32
};

// A model's graphs compiled on some backend: a CompiledModel's, or graphs a caller compiled
// itself on a backend of its choice (the reference backend).
struct ForwardModel {
  const ModelIR& model;
  Backend& backend;
  Executable* encoder;  // encoder-decoder models only
  Executable& decoder;
  DType kv_dtype = DType::kF32;
};

// Encoder-decoder models: encodes `prompt`, then teacher-forces `decoder_ids`. Decoder-only:
// `prompt` is ignored and `decoder_ids` is the whole sequence. step_by_step feeds one token per
// decoder call.
Forward run_forward(const ForwardModel& m, const std::vector<int64_t>& prompt,
                    const std::vector<int64_t>& decoder_ids, bool step_by_step);
// The same on a CompiledModel, with the KV cache in the type its scheduler keeps it in.
Forward run_forward(CompiledModel& engine, const std::vector<int64_t>& prompt,
                    const std::vector<int64_t>& decoder_ids, bool step_by_step);

// Encoder-decoder models, the decoder alone (an ONNX decoder export's inputs): teacher-forces
// `decoder_ids` against given encoder output states [prompt tokens, d_model] (f32 or the plan's
// type) instead of encoding a prompt. The encoder graph's cross K/V projections (the nodes that
// read its encoder_hidden output) are compiled on their own and run on the states. The result's
// encoder_hidden is the states given.
class DecoderOnStates {
 public:
  explicit DecoderOnStates(CompiledModel& engine);
  ~DecoderOnStates();
  Forward run(const Tensor& encoder_hidden, const std::vector<int64_t>& decoder_ids);

 private:
  CompiledModel& engine_;
  ForwardModel model_;  // the engine's graphs, for the decoder
  Graph graph_;         // the cross projections: input encoder_hidden, outputs every layer's K, V
  std::unique_ptr<Executable> exe_;
  EncoderIo io_;  // graph_'s input and outputs
};

}  // namespace kiln
