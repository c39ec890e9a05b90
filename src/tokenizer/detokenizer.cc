// Every piece is cut from Tokenizer::decode of a short window of recent ids rather than built
// from per-token text, so the streamed text inherits decode's exact rules (byte-level UTF-8
// repair, SentencePiece's leading space, skipped special tokens) instead of re-implementing them.
// What makes a window's text agree with the full text:
//  - Byte-level text is the lossy UTF-8 reading of the concatenated bytes. That reading only
//    ever revises its last character, and only when it is U+FFFD standing for a truncated
//    sequence. A window starting inside a character reads that character's remaining bytes as
//    U+FFFD each and is back in step with the full reading from the next character on.
//  - SentencePiece renders each piece on its own, except that the leading "▁" of a piece is
//    dropped while no text precedes it. Windows that start mid-text are decoded after the
//    anchor token, which makes text precede them.
#include "tokenizer/detokenizer.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "core/status.h"

namespace kiln {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Held back: the trailing U+FFFD that more bytes could still turn into a character. A truncated
// UTF-8 sequence has at most three bytes; the byte-level decoder renders it as one U+FFFD and
// SentencePiece's byte pieces as one per byte, so at most three.
constexpr size_t kMaxHeldCharacters = 3;
// Each held U+FFFD stands for at most three bytes (a truncated sequence or a literal U+FFFD),
// and every id in a window renders at least one byte, so the last nine ids that render
// something cover the held text and everything the next ids can change.
constexpr size_t kHeldTokens = 9;
// A window only grows while its text keeps ending in U+FFFD; past this it is cut back.
constexpr size_t kMaxWindow = 32;

size_t stable_size(std::string_view text) {
  size_t end = text.size();
  for (size_t held = 0; held < kMaxHeldCharacters && text.substr(0, end).ends_with(kReplacement);
       ++held) {
    end -= kReplacement.size();
  }
  return end;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  const int64_t vocab_size = tokenizer_.vocab_size();
  for (int64_t id = 0; id < vocab_size && anchor_ < 0; ++id) {
    std::string text = tokenizer_.decode({id});
    if (!text.empty() && text.find(kReplacement) == std::string::npos) {
      anchor_ = id;
      anchor_text_ = std::move(text);
    }
  }
  KILN_CHECK(anchor_ >= 0,
             "streaming detokenization needs a token whose text is complete on its own, and none "
             "of the {} tokens has one",
             vocab_size);
  switch (tokenizer_.kind()) {
    case TokenizerKind::kByteLevelBpe:
      break;  // bytes read the same wherever they stand
    case TokenizerKind::kSentencePiece:
      for (int64_t id = 0; id < vocab_size; ++id) {
        const std::string mid_text = tokenizer_.decode({anchor_, id}).substr(anchor_text_.size());
        if (tokenizer_.decode({id}) != mid_text) {
          probe_ = id;
          break;
        }
      }
      break;
  }
}

bool IncrementalDetokenizer::decode_ignores(int64_t id) const {
  if (id < 0 || id >= tokenizer_.vocab_size()) return true;  // decode drops ids it has no token for
  if (!tokenizer_.decode({id}).empty()) return false;
  switch (tokenizer_.kind()) {
    case TokenizerKind::kByteLevelBpe:
      return true;  // no bytes, so nothing around it changes either
    case TokenizerKind::kSentencePiece:
      // A skipped special token never reaches SentencePiece. An ordinary piece such as "▁" is
      // empty only at the start of the text and must stay.
      return !tokenizer_.decode({id}, /*skip_special=*/false).empty();
  }
  KILN_FAIL("unknown tokenizer kind {}", static_cast<int>(tokenizer_.kind()));
}

std::string IncrementalDetokenizer::decode_window(const std::vector<int64_t>& window) const {
  if (!anchored_) return tokenizer_.decode(window);
  std::vector<int64_t> ids;
  ids.reserve(window.size() + 1);
  ids.push_back(anchor_);
  ids.insert(ids.end(), window.begin(), window.end());
  std::string text = tokenizer_.decode(ids);
  KILN_CHECK(text.starts_with(anchor_text_),
             "decode changed the text of token {} when more ids followed it", anchor_);
  return text.substr(anchor_text_.size());
}

std::string IncrementalDetokenizer::push(int64_t id) {
  if (decode_ignores(id)) return {};
  window_.push_back(id);
  std::string text = decode_window(window_);
  if (!started_) {
    if (text.empty()) {
      forget_unrendered_start();
      return {};
    }
    started_ = true;
  }
  KILN_CHECK(text.compare(0, emitted_, text_, 0, emitted_) == 0,
             "decode changed text it had already produced (window of {} ids)", window_.size());
  const size_t stable = std::max(emitted_, stable_size(text));
  std::string piece = text.substr(emitted_, stable - emitted_);
  emitted_ = stable;
  text_ = std::move(text);
  if (emitted_ == text_.size()) {
    // Nothing is held back, so no later id can change this text; it only needs the anchor.
    window_.clear();
    text_.clear();
    emitted_ = 0;
    anchored_ = true;
  } else if (window_.size() > kMaxWindow) {
    shrink_window();
  }
  return piece;
}

// Nothing has rendered yet. The ids so far can only decide whether SentencePiece strips the
// leading space of the next piece (versions differ on whether a lone "▁" uses that up), which the
// probe shows; keep the fewest ids that leave its rendering unchanged.
void IncrementalDetokenizer::forget_unrendered_start() {
  if (probe_ < 0) {
    window_.clear();
    return;
  }
  const auto probe_text = [&](std::vector<int64_t> ids) {
    ids.push_back(probe_);
    return tokenizer_.decode(ids);
  };
  const std::string expected = probe_text(window_);
  if (probe_text({}) == expected) {
    window_.clear();
  } else if (window_.size() > 1 &&
             probe_text(std::vector<int64_t>(window_.begin(), window_.end() - 1)) == expected) {
    window_.pop_back();
  }
}

// Keeps the last kHeldTokens ids that render something and drops the rest, then finds the held
// text again at the end of the shorter window. Ids that render nothing (SentencePiece control
// pieces) can still end a run of byte pieces, so they stay, but a run of them acts as one.
void IncrementalDetokenizer::shrink_window() {
  const std::string held = text_.substr(emitted_);
  std::vector<int64_t> kept;
  size_t rendering = 0;
  bool previous_renders = true;
  for (auto it = window_.rbegin(); it != window_.rend() && rendering < kHeldTokens; ++it) {
    const bool renders = tokenizer_.decode({anchor_, *it}).size() > anchor_text_.size();
    if (!renders && !previous_renders) continue;
    kept.push_back(*it);
    rendering += renders ? 1 : 0;
    previous_renders = renders;
  }
  std::reverse(kept.begin(), kept.end());
  window_ = std::move(kept);
  anchored_ = true;
  text_ = decode_window(window_);
  KILN_CHECK(text_.ends_with(held), "the held-back text changed when the window was shortened");
  emitted_ = text_.size() - held.size();
}

std::string IncrementalDetokenizer::finish() {
  std::string rest = text_.substr(emitted_);
  started_ = false;
  anchored_ = false;
  window_.clear();
  text_.clear();
  emitted_ = 0;
  return rest;
}

}  // namespace kiln
