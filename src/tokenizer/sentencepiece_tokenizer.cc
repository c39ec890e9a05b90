// T5's SentencePiece tokenizer with HuggingFace T5Tokenizer's conventions on top of the model:
// the `<extra_id_N>` sentinels live after the model's pieces, special tokens written in the
// text are split out before SentencePiece sees it, and </s> is appended.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

// ---- model checks --------------------------------------------------------------------------
// libsentencepiece trusts the normalization tries stored in a model and reads out of bounds on
// a corrupt one (found by fuzzing under AddressSanitizer), so they are checked before the model
// is handed over. The protobuf is walked by hand because the library exposes no parser.

bool read_varint(std::string_view data, size_t& pos, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= data.size()) return false;
    const auto byte = static_cast<unsigned char>(data[pos++]);
    value |= uint64_t{byte & 0x7Fu} << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// Calls visit(field_number, bytes) for each length-delimited field of a protobuf message;
// false when the message is not well-formed.
template <typename Visit>
bool for_each_bytes_field(std::string_view message, Visit&& visit) {
  size_t pos = 0;
  while (pos < message.size()) {
    uint64_t key = 0;
    uint64_t value = 0;
    if (!read_varint(message, pos, key)) return false;
    switch (key & 7) {
      case 0:
        if (!read_varint(message, pos, value)) return false;
        break;
      case 1:
        if (message.size() - pos < 8) return false;
        pos += 8;
        break;
      case 5:
        if (message.size() - pos < 4) return false;
        pos += 4;
        break;
      case 2:
        if (!read_varint(message, pos, value) || value > message.size() - pos) return false;
        if (!visit(key >> 3, message.substr(pos, value))) return false;
        pos += value;
        break;
      default:  // groups (3, 4) are not used by SentencePiece; 6 and 7 do not exist
        return false;
    }
  }
  return true;
}

uint32_t load_u32(const char* p) {
  uint32_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}

// A precompiled charsmap is [uint32 trie bytes][Darts-clone double array][NUL-terminated
// replacement strings]. Returns why libsentencepiece could not use it safely, or "" when every
// lookup it can make stays in bounds: each transition (for any input byte) lands inside the
// array, the trie has no cycle, no path holds more than the 32 matches the library keeps, and
// each match points at a terminated replacement string. Darts-clone shares common suffixes, so
// the trie is a DAG and is walked depth first with memoized per-node results.
std::string charsmap_problem(std::string_view blob) {
  if (blob.empty()) return "";
  if (blob.size() < 4) return "truncated";
  const uint32_t trie_bytes = load_u32(blob.data());
  if (trie_bytes > blob.size() - 4) return "trie larger than its blob";
  const size_t units = trie_bytes / 4;
  const std::string_view replacements = blob.substr(4 + trie_bytes);
  if (units == 0) return "empty trie";
  if (replacements.empty() || replacements.back() != '\0') return "unterminated replacements";
  const auto unit = [&](size_t i) { return load_u32(blob.data() + 4 + 4 * i); };
  const auto offset = [](uint32_t u) -> size_t { return (u >> 10) << ((u & (1u << 9)) >> 6); };
  const auto has_leaf = [](uint32_t u) { return ((u >> 8) & 1) == 1; };
  const auto label = [](uint32_t u) { return u & ((1u << 31) | 0xFF); };
  constexpr int kMaxMatchesPerPrefix = 32;

  enum class Visit : uint8_t { kNew, kOpen, kDone };
  std::vector<Visit> visit(units, Visit::kNew);
  std::vector<uint8_t> matches_below(units, 0);  // most matches on a path from the node, capped
  struct Frame {
    size_t base;
    uint32_t next_byte;
    int best;
    int pending_leaf;  // match count of the edge to the child being explored
  };
  std::vector<Frame> stack;
  const auto open = [&](size_t base) -> bool {
    if ((base | 0xFF) >= units) return false;
    visit[base] = Visit::kOpen;
    stack.push_back({base, 0, 0, 0});
    return true;
  };
  if (!open(offset(unit(0)))) return "transition outside the trie";
  while (!stack.empty()) {
    Frame& frame = stack.back();
    if (frame.next_byte == 256) {
      const size_t base = frame.base;
      matches_below[base] = static_cast<uint8_t>(std::min(frame.best, kMaxMatchesPerPrefix + 1));
      visit[base] = Visit::kDone;
      stack.pop_back();
      if (!stack.empty()) {
        Frame& parent = stack.back();
        parent.best = std::max(parent.best, parent.pending_leaf + matches_below[base]);
      }
      continue;
    }
    const uint32_t byte = frame.next_byte++;
    const size_t child = frame.base ^ byte;
    const uint32_t child_unit = unit(child);
    if (label(child_unit) != byte) continue;
    const size_t next = child ^ offset(child_unit);
    const int leaf = has_leaf(child_unit) ? 1 : 0;
    if (leaf) {
      if (next >= units) return "match outside the trie";
      if ((unit(next) & 0x7FFFFFFFu) >= replacements.size()) return "replacement outside the blob";
    }
    if (next >= units || visit[next] == Visit::kNew) {
      frame.pending_leaf = leaf;
      // open() may move the stack, so `frame` is not touched after it.
      if (!open(next)) return "transition outside the trie";
    } else if (visit[next] == Visit::kOpen) {
      return "cycle in the trie";
    } else {
      frame.best = std::max(frame.best, leaf + matches_below[next]);
    }
  }
  if (matches_below[offset(unit(0))] > kMaxMatchesPerPrefix) return "too many matches on one path";
  return "";
}

// Empty when the normalizer and denormalizer specs of a serialized ModelProto are safe.
std::string model_problem(std::string_view model) {
  constexpr uint64_t kNormalizerSpec = 3, kDenormalizerSpec = 5, kPrecompiledCharsmap = 2;
  std::string problem;
  const bool well_formed = for_each_bytes_field(model, [&](uint64_t field, std::string_view spec) {
    if (field != kNormalizerSpec && field != kDenormalizerSpec) return true;
    return for_each_bytes_field(spec, [&](uint64_t spec_field, std::string_view charsmap) {
      if (spec_field == kPrecompiledCharsmap && problem.empty()) {
        problem = charsmap_problem(charsmap);
        if (!problem.empty()) problem = "normalization rules: " + problem;
      }
      return true;
    });
  });
  return well_formed ? problem : "malformed protobuf";
}

// T5Tokenizer's default number of sentinels, used by every T5 and Flan-T5 checkpoint.
constexpr int kExtraIds = 100;
constexpr std::string_view kWordBoundary = "\xE2\x96\x81";  // U+2581, SentencePiece's space

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string model_bytes, const std::string& source);

  TokenizerKind kind() const override { return TokenizerKind::kSentencePiece; }
  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  const std::string& source_bytes() const override { return source_bytes_; }

 private:
  struct SpecialToken {
    std::string text;
    int id;
  };

  void encode_plain(std::string_view text, std::vector<int64_t>& ids) const;
  const SpecialToken* match_special(std::string_view text, size_t pos) const;

  std::string source_bytes_;
  std::string source_;
  sentencepiece::SentencePieceProcessor processor_;
  int piece_count_ = 0;
  int64_t vocab_size_ = 0;
  int eos_id_ = -1;
  std::vector<SpecialToken> specials_;  // longest text first, so matching is leftmost-longest
  std::array<bool, 256> special_first_byte_{};
  std::unordered_map<int, std::string> special_text_by_id_;
};

SentencePieceTokenizer::SentencePieceTokenizer(std::string model_bytes, const std::string& source)
    : source_bytes_(std::move(model_bytes)), source_(source) {
  KILN_CHECK(!source_bytes_.empty(), "{}: empty SentencePiece model", source);
  const std::string problem = model_problem(source_bytes_);
  KILN_CHECK(problem.empty(), "{}: not a valid SentencePiece model ({})", source, problem);
  const auto status = processor_.LoadFromSerializedProto(source_bytes_);
  KILN_CHECK(status.ok(), "{}: not a valid SentencePiece model ({})", source, status.ToString());
  piece_count_ = processor_.GetPieceSize();
  KILN_CHECK(piece_count_ > 0, "{}: the SentencePiece model has no pieces", source);
  eos_id_ = processor_.eos_id();
  KILN_CHECK(eos_id_ >= 0 && eos_id_ < piece_count_,
             "{}: the SentencePiece model has no </s> (eos) piece, which T5 appends to every input",
             source);

  // T5Tokenizer's special tokens: pad, eos, unk and the sentinels, numbered from the top down
  // (`<extra_id_0>` is the last id) after the model's pieces. Some converted tokenizer.json
  // files put the sentinels at 4..103 instead, on top of real pieces; the models' embeddings
  // follow T5Tokenizer.
  for (int id : {processor_.pad_id(), eos_id_, processor_.unk_id()}) {
    if (id >= 0 && id < piece_count_) specials_.push_back({processor_.IdToPiece(id), id});
  }
  for (int n = 0; n < kExtraIds; ++n) {
    specials_.push_back({fmt::format("<extra_id_{}>", n), piece_count_ + kExtraIds - 1 - n});
  }
  vocab_size_ = int64_t{piece_count_} + kExtraIds;
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.text.size() > b.text.size(); });
  for (const SpecialToken& special : specials_) {
    KILN_CHECK(!special.text.empty(), "{}: special piece {} has no text", source, special.id);
    special_first_byte_[static_cast<unsigned char>(special.text[0])] = true;
    special_text_by_id_.emplace(special.id, special.text);
  }
}

const SentencePieceTokenizer::SpecialToken* SentencePieceTokenizer::match_special(
    std::string_view text, size_t pos) const {
  if (!special_first_byte_[static_cast<unsigned char>(text[pos])]) return nullptr;
  for (const SpecialToken& special : specials_) {
    if (text.compare(pos, special.text.size(), special.text) == 0) return &special;
  }
  return nullptr;
}

void SentencePieceTokenizer::encode_plain(std::string_view text, std::vector<int64_t>& ids) const {
  if (text.empty()) return;
  std::vector<int> piece_ids;
  const auto status = processor_.Encode(text, &piece_ids);
  KILN_CHECK(status.ok(), "{}: SentencePiece could not encode the text ({})", source_,
             status.ToString());
  ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
}

// Text between special tokens is encoded on its own with SentencePiece's dummy prefix, which is
// what tokenizer.json's Metaspace(prepend_scheme="always") does to every such stretch.
std::vector<int64_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  const std::string_view view = text;
  size_t segment_start = 0;
  for (size_t pos = 0; pos < view.size();) {
    const SpecialToken* special = match_special(view, pos);
    if (special == nullptr) {
      ++pos;
      continue;
    }
    encode_plain(view.substr(segment_start, pos - segment_start), ids);
    ids.push_back(special->id);
    pos += special->text.size();
    segment_start = pos;
  }
  encode_plain(view.substr(segment_start), ids);
  ids.push_back(eos_id_);
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids,
                                           bool skip_special) const {
  std::string out;
  std::vector<int> run;  // consecutive ordinary pieces, detokenized together
  const auto flush = [&] {
    if (run.empty()) return;
    std::string text;
    const auto status = processor_.Decode(run, &text);
    KILN_CHECK(status.ok(), "{}: SentencePiece could not decode ids ({})", source_,
               status.ToString());
    // SentencePiece drops the word boundary of the first piece; after a special token that
    // boundary is a real space, as HF's Metaspace decoder keeps it.
    if (!out.empty() && processor_.IdToPiece(run.front()).starts_with(kWordBoundary)) out += ' ';
    out += text;
    run.clear();
  };
  for (int64_t id : ids) {
    // HF drops ids it has no token for (e.g. the model's padded embedding rows).
    if (id < 0 || id >= vocab_size_) continue;
    const auto special = special_text_by_id_.find(static_cast<int>(id));
    if (special != special_text_by_id_.end()) {
      if (skip_special) continue;
      flush();
      out += special->second;
      continue;
    }
    if (id < piece_count_) run.push_back(static_cast<int>(id));
  }
  flush();
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& model_bytes,
                                                        const std::string& source) {
  return std::make_unique<SentencePieceTokenizer>(model_bytes, source);
}

}  // namespace kiln
