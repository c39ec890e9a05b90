// Teacher-forced logits: a model run over a sequence it is given (not one it generates), with
// the next-token logits of the positions asked for. What the sensitivity fallback compares a
// quantized plan with its float plan on (builder/sensitivity.h): the same tokens fed to both,
// so that one plan's different choice early on does not change what the other is scored on.
#pragma once

#include <cstdint>
#include <span>
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

// Per sequence, [decoder_ids.size() - first_row, vocab] f32 on the host. The sequences run
// together, as many per step as the plan's steps hold (its max_step_tokens and max_batch): an
// encoder step over their prompts (encoder-decoder models), then a decoder step over their
// whole decoder sequences, with the K/V cache in the type the scheduler keeps it in for the plan.
// Each sequence's rows do not depend on the others (the runtime's ragged steps). Throws for an
// empty sequence, first_row out of range, a sequence longer than the plan's steps, or more rows
// of one sequence than a step's logits hold (the plan's max_batch).
std::vector<Tensor> forced_logits(CompiledModel& model, std::span<const ForcedSequence> sequences);
// One sequence.
Tensor forced_logits(CompiledModel& model, const ForcedSequence& sequence);

}  // namespace kiln
