// Streaming detokenization: text for generated ids as they arrive, built only from
// Tokenizer::decode on short windows so that it agrees with decode by construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kiln {

// Turns generated ids into text pieces as they arrive. The concatenation of every piece returned
// by push() and then finish() equals tokenizer.decode(all ids) exactly (special tokens skipped,
// ids outside the vocabulary dropped, as decode does). Text that the next ids could still change
// (a UTF-8 character split over byte-level tokens) is held back until it is complete, so a
// character never arrives in two pieces; any trailing U+FFFD waits for the next id, since it may
// be an unfinished character. Each push decodes a window of boundedly many ids, whatever the
// length of the generation. `tokenizer` must outlive this object.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer);

  // The text that became final with `id`; often empty.
  std::string push(int64_t id);
  // What was held back, rendered as decode renders it at the end of the text (an incomplete
  // UTF-8 sequence becomes U+FFFD). Leaves the detokenizer ready for a new sequence.
  std::string finish();

 private:
  bool decode_ignores(int64_t id) const;
  std::string decode_window(const std::vector<int64_t>& window) const;
  void forget_unrendered_start();
  void shrink_window();

  const Tokenizer& tokenizer_;
  // A token decoded in front of windows that start mid-text, so that SentencePiece renders the
  // window's first piece as it does mid-text (with its leading space). Its text is complete and
  // non-empty, and nothing after it changes it.
  int64_t anchor_ = -1;
  std::string anchor_text_;
  // For SentencePiece: a piece rendered differently at the start of the text than after it,
  // used to tell whether ids that rendered nothing still matter; -1 when position never matters.
  int64_t probe_ = -1;

  bool started_ = false;   // whether the text so far is non-empty
  bool anchored_ = false;  // whether window_ is decoded after the anchor
  std::vector<int64_t> window_;
  std::string text_;    // decode of window_, without the anchor's text
  size_t emitted_ = 0;  // bytes of text_ already returned; the rest is held back
};

}  // namespace kiln
