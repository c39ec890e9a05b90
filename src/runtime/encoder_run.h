// Running an encoder-decoder model's encoder over a batch of prompts and giving each sequence
// its cross-attention K/V (the scheduler's prompt steps and the model tests share it).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "graph/model_ir.h"

namespace kiln {

// Positions of the encoder contract's input and outputs (graph/model_ir.h).
struct EncoderIo {
  int input_ids = -1;
  int hidden = -1;                    // encoder_hidden
  std::vector<int> cross_k, cross_v;  // per decoder layer
  static EncoderIo of(const Graph& encoder, int layers);
};

// Runs `encoder` (compiled from `graph`) on `inputs` for the sequences step.layout lays out and
// returns each sequence's cross K/V: its own rows of every layer's K then V in one buffer (a
// request must not keep the whole batch's encoder output alive), in the type `backend` keeps K/V
// in for `precision` (the CPU's bf16 and int8-weight plans: bf16). A graph that streams its
// outputs (CPU plans) has each projection copied out as its node writes it, so the projections
// share a workspace buffer; otherwise they are all copied after the step, in one call (CUDA: one
// launch). The buffers come from `cross_memory` where given (the scheduler's pool of host
// chunks), else from the backend's allocator. With `hidden`, also a host copy of the encoder's
// output states. With `sequences`, only the first that many sequences of the layout get cross
// K/V (the ones after them pad the step to a shape the backend replays).
std::vector<std::shared_ptr<CrossKv>> run_encoder(
    Executable& encoder, const Graph& graph, const EncoderIo& io, Backend& backend,
    Precision precision, std::span<const Tensor> inputs, StepContext step, Tensor* hidden = nullptr,
    Allocator* cross_memory = nullptr, int sequences = -1);

}  // namespace kiln
