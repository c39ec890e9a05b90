#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <system_error>

#include "core/status.h"
#include "io/mmap_file.h"

namespace kiln {

std::string_view tokenizer_kind_name(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::kSentencePiece:
      return "sentencepiece";
    case TokenizerKind::kByteLevelBpe:
      return "byte_level_bpe";
  }
  return "?";
}

bool parse_tokenizer_kind(std::string_view name, TokenizerKind* out) {
  for (TokenizerKind k : {TokenizerKind::kSentencePiece, TokenizerKind::kByteLevelBpe})
    if (tokenizer_kind_name(k) == name) {
      *out = k;
      return true;
    }
  return false;
}

std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::string& bytes,
                                          const std::string& source) {
  switch (kind) {
    case TokenizerKind::kSentencePiece:
      return make_sentencepiece_tokenizer(bytes, source);
    case TokenizerKind::kByteLevelBpe:
      return make_bpe_tokenizer(bytes, source);
  }
  // Reached only with a kind byte read from a corrupt or newer plan.
  KILN_FAIL("{}: unknown tokenizer kind {}", source, static_cast<int>(kind));
}

std::unique_ptr<Tokenizer> load_tokenizer_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    KILN_FAIL_KIND(ErrorKind::kNotFound, "model directory not found: {}", dir);
  }
  // T5 checkpoints ship both files, and their tokenizer.json is a Unigram model this loader does
  // not implement, so spiece.model must win.
  const std::string spiece = (fs::path(dir) / "spiece.model").string();
  if (fs::is_regular_file(spiece, error)) {
    return make_sentencepiece_tokenizer(read_text_file(spiece), spiece);
  }
  const std::string json = (fs::path(dir) / "tokenizer.json").string();
  if (fs::is_regular_file(json, error)) return make_bpe_tokenizer(read_text_file(json), json);
  KILN_FAIL_KIND(ErrorKind::kNotFound,
                 "{}: no tokenizer found (expected spiece.model or tokenizer.json)", dir);
}

}  // namespace kiln
