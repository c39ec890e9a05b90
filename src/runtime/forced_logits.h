// Teacher-forced logits: a model run over a sequence it is given (not one it generates), with
// the next-token logits of the positions asked for. What the sensitivity fallback compares a
// quantized plan with its float plan on (builder/sensitivity.h): the same tokens fed to both,
// so that one plan's different choice early on does not change what the other is scored on.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/compiled_model.h"

namespace kiln {

// A sequence to score. Encoder-decoder models: `prompt` is the encoder's input and `decoder_ids`
// the decoder's (its start token first); decoder-only models: `prompt` is empty and `decoder_ids`
// the whole sequence. Logits are computed for decoder positions first_row..decoder_ids.size()-1
// (each row predicts the token after its position).
struct ForcedSequence {
  std::vector<int64_t> prompt;
  std::vector<int64_t> decoder_ids;
  int64_t first_row = 0;
};

// [decoder_ids.size() - first_row, vocab] f32 on the host: one encoder step (encoder-decoder
// models) and one decoder step over the whole sequence, with the K/V cache in the type the
// scheduler keeps it in for the plan. Throws for an empty sequence, first_row out of range, or
// a sequence longer than the plan's steps.
Tensor forced_logits(CompiledModel& model, const ForcedSequence& sequence);

}  // namespace kiln
