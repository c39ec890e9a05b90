// HuggingFace's logits processors (repetition penalty, n-gram bans, bad words, suppressed and
// forced tokens, minimum lengths) for one beam's next token, as the RowEdit a backend applies
// where the logits live. HF's order: repetition penalty, no-repeat n-grams, encoder no-repeat
// n-grams, bad words, min_length, min_new_tokens, forced BOS, forced EOS, suppressed tokens.
#pragma once

#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "kiln/generate.h"

namespace kiln {

struct ProcessorState {
  // HF's input_ids: the prompt and the generated tokens (decoder-only), or the decoder start
  // token and the generated tokens (encoder-decoder).
  std::span<const int64_t> sequence;
  // What HF passes as encoder_input_ids: the encoder's input (encoder-decoder) or the prompt.
  std::span<const int64_t> prompt;
  int64_t generated = 0;  // tokens generated so far
  int64_t max_new = 0;    // the request's limit on them
  std::span<const int64_t> eos_ids;
  bool beam_search = false;  // the processors see log-probabilities
};

// Whether EOS may not be chosen next (min_new_tokens, min_length).
bool eos_banned(const GenerationParams& params, const ProcessorState& state);

// The edits of `params`' processors for the next token of a sequence in `state`; false (edit
// untouched) when params.processes_logits() is false, so that rows without processors keep the
// selection kernels' own EOS ban. The EOS ban of eos_banned() is part of the edit (before the
// forced tokens, as in HF). edit->row is the caller's.
bool make_row_edit(const GenerationParams& params, const ProcessorState& state, RowEdit* edit);

}  // namespace kiln
