// Tokenizers that reproduce HuggingFace ids exactly: SentencePiece for T5, byte-level BPE from
// tokenizer.json for BLOOM. Constructed from the bytes of the model files so that a plan can
// carry them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

enum class TokenizerKind : uint8_t { kSentencePiece, kByteLevelBpe };
// The names plans store: "sentencepiece", "byte_level_bpe".
std::string_view tokenizer_kind_name(TokenizerKind kind);
bool parse_tokenizer_kind(std::string_view name, TokenizerKind* out);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual TokenizerKind kind() const = 0;
  // Ids as HuggingFace's tokenizer(text)["input_ids"]: T5 appends </s>; BLOOM adds nothing.
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // Text as tokenizer.decode(ids, skip_special_tokens=skip_special).
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const = 0;
  virtual int64_t vocab_size() const = 0;
  // The bytes this tokenizer was made from (spiece.model or tokenizer.json), stored in plans.
  virtual const std::string& source_bytes() const = 0;
};

// spiece.model bytes. `source` names the file in errors.
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_bytes,
                                                        const std::string& source);
// tokenizer.json text (model.type "BPE" with a ByteLevel pre-tokenizer/decoder).
std::unique_ptr<Tokenizer> make_bpe_tokenizer(const std::string& tokenizer_json,
                                              const std::string& source);
// From the kind and stored bytes (plan loading).
std::unique_ptr<Tokenizer> make_tokenizer(TokenizerKind kind, const std::string& bytes,
                                          const std::string& source);
// Picks the tokenizer of an HF model directory: spiece.model if present, else tokenizer.json.
std::unique_ptr<Tokenizer> load_tokenizer_dir(const std::string& dir);

}  // namespace kiln
