// Byte-level BPE (BLOOM, GPT-2 family) from a HuggingFace tokenizer.json. Reproduces the
// `tokenizers` pipeline step by step: added tokens are split out first, then the declared
// pre-tokenizer, BPE merges by rank inside each piece, and the ByteLevel decoder. Anything the
// file declares that is not implemented here is refused at load time rather than approximated,
// because a silently different pipeline gives ids the model was never trained on.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

using Json = nlohmann::json;

// Ids beyond this are refused so a corrupt file cannot make us allocate gigabytes of tables.
constexpr int64_t kMaxTokenId = int64_t{1} << 22;

// BLOOM's Split pattern. Oniguruma reads the bracket as one negated class holding '(', \s, '|',
// the nested punctuation set and ')', which is_bloom_word_char implements without a regex engine.
constexpr std::string_view kBloomSplitPattern =
    " ?[^(\\s|[.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c])]+";

// ---- UTF-8 ---------------------------------------------------------------------------------

struct Utf8Char {
  char32_t code_point;  // U+FFFD when !valid
  uint32_t length;      // bytes consumed; for invalid input the maximal invalid subpart (>= 1)
  bool valid;
};

// Decodes one character following Unicode's "maximal subpart" rule, which is what Rust's
// String::from_utf8_lossy (and so HF's decode) uses to place U+FFFD.
Utf8Char decode_utf8(std::string_view text, size_t pos) {
  const auto byte_at = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte_at(pos);
  if (lead < 0x80) return {lead, 1, true};
  uint32_t continuation_bytes = 0;
  char32_t code_point = 0;
  unsigned char low = 0x80, high = 0xBF;  // allowed range of the next byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    continuation_bytes = 1;
    code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    continuation_bytes = 2;
    code_point = lead & 0x0F;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    continuation_bytes = 3;
    code_point = lead & 0x07;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // beyond U+10FFFF
  } else {
    return {0xFFFD, 1, false};
  }
  uint32_t length = 1;
  for (uint32_t k = 0; k < continuation_bytes; ++k) {
    if (pos + length >= text.size()) return {0xFFFD, length, false};
    const unsigned char next = byte_at(pos + length);
    if (next < low || next > high) return {0xFFFD, length, false};
    code_point = (code_point << 6) | (next & 0x3F);
    ++length;
    low = 0x80;
    high = 0xBF;
  }
  return {code_point, length, true};
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const Utf8Char c = decode_utf8(bytes, pos);
    if (c.valid) {
      out.append(bytes.substr(pos, c.length));
    } else {
      append_utf8(0xFFFD, out);
    }
    pos += c.length;
  }
  return out;
}

// Unicode White_Space: what both Oniguruma's \s and Rust's char::is_whitespace accept.
bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The characters of BLOOM's negated class besides \s.
constexpr std::array<char32_t, 14> kBloomBreaks = {
    U'(',      U')',      U'|',      U'.',      U',',      U'!',      U'?',
    U'\u2026', U'\u3002', U'\uff0c', U'\u3001', U'\u0964', U'\u06d4', U'\u060c'};

// Invalid bytes count as word characters so that they stay inside the surrounding piece and
// reach the byte-level model unchanged.
bool is_bloom_word_char(const Utf8Char& c) {
  if (!c.valid) return true;
  return !is_unicode_whitespace(c.code_point) &&
         std::find(kBloomBreaks.begin(), kBloomBreaks.end(), c.code_point) == kBloomBreaks.end();
}

// Split(kBloomSplitPattern, behavior=Isolated): every match and every gap between matches is
// its own piece.
void split_bloom(std::string_view text, std::vector<std::string_view>& pieces) {
  size_t gap_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Char c = decode_utf8(text, pos);
    size_t word_begin = pos;
    size_t scan = pos;
    if (c.valid && c.code_point == U' ') {
      // " ?" only helps when a word character follows; otherwise no match starts here.
      if (pos + 1 >= text.size() || !is_bloom_word_char(decode_utf8(text, pos + 1))) {
        pos += c.length;
        continue;
      }
      scan = pos + 1;
    } else if (!is_bloom_word_char(c)) {
      pos += c.length;
      continue;
    }
    size_t end = scan;
    while (end < text.size()) {
      const Utf8Char next = decode_utf8(text, end);
      if (!is_bloom_word_char(next)) break;
      end += next.length;
    }
    if (gap_start < word_begin) pieces.push_back(text.substr(gap_start, word_begin - gap_start));
    pieces.push_back(text.substr(word_begin, end - word_begin));
    pos = gap_start = end;
  }
  if (gap_start < text.size()) pieces.push_back(text.substr(gap_start));
}

// Steps back over Unicode whitespace ending at `pos`, not going below `floor`.
size_t strip_whitespace_before(std::string_view text, size_t floor, size_t pos) {
  while (pos > floor) {
    size_t start = pos - 1;
    while (start > floor && pos - start < 4 &&
           (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
      --start;
    const Utf8Char c = decode_utf8(text, start);
    if (!c.valid || start + c.length != pos || !is_unicode_whitespace(c.code_point)) break;
    pos = start;
  }
  return pos;
}

size_t skip_whitespace_after(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    const Utf8Char c = decode_utf8(text, pos);
    if (!c.valid || !is_unicode_whitespace(c.code_point)) break;
    pos += c.length;
  }
  return pos;
}

// ---- ByteLevel (GPT-2's byte <-> printable character map) ---------------------------------

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_utf8;
  // Indexed by code point; the map's image is U+0021..U+0143. -1: not a byte-level character.
  std::array<int16_t, 324> char_to_byte;
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    t.char_to_byte.fill(-1);
    // Printable Latin-1 bytes map to themselves; the rest are moved to 256+n in byte order so
    // that every byte has a visible, non-whitespace character.
    const auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? static_cast<char32_t>(b) : 256 + shifted++;
      append_utf8(cp, t.byte_to_utf8[b]);
      t.char_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

// ByteLevel decoder on one token: byte-level characters become their bytes; a token holding any
// other character is passed through as its UTF-8, as `tokenizers` does.
std::string byte_level_decode(const std::string& token) {
  const ByteLevelTables& tables = byte_level_tables();
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    const Utf8Char c = decode_utf8(token, pos);
    if (!c.valid || c.code_point >= tables.char_to_byte.size() ||
        tables.char_to_byte[c.code_point] < 0)
      return token;
    bytes += static_cast<char>(tables.char_to_byte[c.code_point]);
    pos += c.length;
  }
  return bytes;
}

// ---- tokenizer.json reading ----------------------------------------------------------------

// Field access whose errors name the file and the dotted path of the field.
class JsonFields {
 public:
  explicit JsonFields(const std::string& source) : source_(source) {}

  // nullptr when the key is absent or null.
  const Json* find(const Json& object, std::string_view path, const char* key) const {
    KILN_CHECK(object.is_object(), "{}: '{}' must be a JSON object, found {}", source_, path,
               object.type_name());
    const auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }
  const Json& require(const Json& object, std::string_view path, const char* key) const {
    const Json* value = find(object, path, key);
    KILN_CHECK(value != nullptr, "{}: missing field '{}{}{}'", source_, path,
               path.empty() ? "" : ".", key);
    return *value;
  }
  std::string string(const Json& value, std::string_view path) const {
    KILN_CHECK(value.is_string(), "{}: '{}' must be a string, found {}", source_, path,
               value.type_name());
    return value.get<std::string>();
  }
  bool flag(const Json& object, std::string_view path, const char* key, bool fallback) const {
    const Json* value = find(object, path, key);
    if (value == nullptr) return fallback;
    KILN_CHECK(value->is_boolean(), "{}: '{}.{}' must be true or false, found {}", source_, path,
               key, value->type_name());
    return value->get<bool>();
  }
  int32_t token_id(const Json& value, std::string_view path) const {
    KILN_CHECK(value.is_number_integer(), "{}: '{}' must be an integer token id, found {}", source_,
               path, value.type_name());
    const int64_t id = value.get<int64_t>();
    KILN_CHECK(id >= 0 && id < kMaxTokenId, "{}: '{}' = {} is not a valid token id", source_, path,
               id);
    return static_cast<int32_t>(id);
  }
  const std::string& source() const { return source_; }

 private:
  const std::string& source_;
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
  bool lstrip;
  bool rstrip;
  bool normalized;
};

// A stretch of input text: either an added token or ordinary text for the model.
struct Segment {
  std::string_view text;
  int32_t added_id;  // -1 for ordinary text
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(std::string json_text, const std::string& source);

  TokenizerKind kind() const override { return TokenizerKind::kByteLevelBpe; }
  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  const std::string& source_bytes() const override { return source_bytes_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  struct TokenEntry {
    std::string bytes;  // what the ByteLevel decoder makes of the token
    bool known = false;
    bool special = false;
  };

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  void parse_model(const Json& model, const JsonFields& fields);
  void parse_added_tokens(const Json& root, const JsonFields& fields);
  void parse_pre_tokenizer(const Json& root, const JsonFields& fields);
  void parse_post_processor(const Json& root, const JsonFields& fields);
  void check_pipeline(const Json& root, const JsonFields& fields) const;

  void split_added(std::string_view text, bool normalized_pass, std::vector<Segment>& out) const;
  void encode_piece(std::string_view piece, std::vector<int64_t>& ids) const;

  std::string source_bytes_;
  std::unordered_map<std::string, int32_t> vocab_;  // byte-level token text -> id
  std::unordered_map<uint64_t, Merge> merges_;      // (left id, right id) -> merge
  std::array<int32_t, 256> byte_ids_{};             // id of each single byte, -1 if absent
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  std::vector<AddedToken> added_tokens_;
  // Added-token indices by first byte, longest content first, for leftmost-longest matching.
  std::array<std::vector<uint32_t>, 256> added_by_first_byte_;

  bool bloom_split_ = false;
  bool add_prefix_space_ = false;
  std::vector<int64_t> prefix_ids_;  // TemplateProcessing special tokens around the sequence
  std::vector<int64_t> suffix_ids_;

  std::vector<TokenEntry> tokens_;  // by id
};

BpeTokenizer::BpeTokenizer(std::string json_text, const std::string& source)
    : source_bytes_(std::move(json_text)) {
  Json root;
  try {
    root = Json::parse(source_bytes_);
  } catch (const Json::parse_error& e) {
    KILN_FAIL("{}: malformed JSON ({})", source, e.what());
  }
  KILN_CHECK(root.is_object(), "{}: tokenizer.json must hold a JSON object, found {}", source,
             root.type_name());
  const JsonFields fields(source);
  parse_model(fields.require(root, "", "model"), fields);
  check_pipeline(root, fields);
  parse_added_tokens(root, fields);
  parse_pre_tokenizer(root, fields);
  parse_post_processor(root, fields);
}

void BpeTokenizer::check_pipeline(const Json& root, const JsonFields& fields) const {
  const std::string& source = fields.source();
  if (const Json* normalizer = fields.find(root, "", "normalizer")) {
    const Json* type = fields.find(*normalizer, "normalizer", "type");
    KILN_FAIL(
        "{}: field 'normalizer' ({}) is not supported; only byte-level BPE without a "
        "normalizer is implemented",
        source, type ? type->dump() : normalizer->dump());
  }
  const Json& decoder = fields.require(root, "", "decoder");
  const std::string decoder_type =
      fields.string(fields.require(decoder, "decoder", "type"), "decoder.type");
  KILN_CHECK(decoder_type == "ByteLevel",
             "{}: field 'decoder.type' is \"{}\"; only \"ByteLevel\" is supported", source,
             decoder_type);
}

void BpeTokenizer::parse_model(const Json& model, const JsonFields& fields) {
  const std::string& source = fields.source();
  if (const Json* type = fields.find(model, "model", "type")) {
    const std::string name = fields.string(*type, "model.type");
    KILN_CHECK(name == "BPE", "{}: field 'model.type' is \"{}\"; only \"BPE\" is supported", source,
               name);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* affix = fields.find(model, "model", key)) {
      KILN_CHECK(affix->is_string() && affix->get<std::string>().empty(),
                 "{}: field 'model.{}' = {} is not supported", source, key, affix->dump());
    }
  }
  if (const Json* dropout = fields.find(model, "model", "dropout")) {
    KILN_CHECK(dropout->is_number() && dropout->get<double>() == 0.0,
               "{}: field 'model.dropout' = {} is not supported (it makes encoding random)", source,
               dropout->dump());
  }
  KILN_CHECK(!fields.flag(model, "model", "byte_fallback", false),
             "{}: field 'model.byte_fallback' = true is not supported", source);
  fuse_unk_ = fields.flag(model, "model", "fuse_unk", false);
  ignore_merges_ = fields.flag(model, "model", "ignore_merges", false);

  const Json& vocab = fields.require(model, "model", "vocab");
  KILN_CHECK(vocab.is_object(), "{}: field 'model.vocab' must be an object of token -> id", source);
  int32_t max_id = -1;
  for (const auto& [token, id_json] : vocab.items()) {
    const int32_t id = fields.token_id(id_json, "model.vocab[\"" + token + "\"]");
    vocab_[token] = id;
    max_id = std::max(max_id, id);
  }
  tokens_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : vocab_) {
    tokens_[id].bytes = byte_level_decode(token);
    tokens_[id].known = true;
  }
  const ByteLevelTables& tables = byte_level_tables();
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(tables.byte_to_utf8[b]);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  if (const Json* unk = fields.find(model, "model", "unk_token")) {
    const std::string unk_token = fields.string(*unk, "model.unk_token");
    const auto it = vocab_.find(unk_token);
    KILN_CHECK(it != vocab_.end(), "{}: field 'model.unk_token' \"{}\" is not in model.vocab",
               source, unk_token);
    unk_id_ = it->second;
  }

  const Json& merges = fields.require(model, "model", "merges");
  KILN_CHECK(merges.is_array(), "{}: field 'model.merges' must be an array", source);
  KILN_CHECK(merges.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
             "{}: field 'model.merges' is too long", source);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& merge = merges[rank];
    std::string left, right;
    // Newer files store ["a", "b"]; older ones "a b".
    if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else if (merge.is_string()) {
      const std::string line = merge.get<std::string>();
      const size_t space = line.find(' ');
      KILN_CHECK(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
                 "{}: field 'model.merges[{}]' = \"{}\" is not \"left right\"", source, rank, line);
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else {
      KILN_FAIL("{}: field 'model.merges[{}]' = {} is not a pair of strings", source, rank,
                merge.dump());
    }
    const auto left_it = vocab_.find(left);
    const auto right_it = vocab_.find(right);
    const auto merged_it = vocab_.find(left + right);
    KILN_CHECK(left_it != vocab_.end() && right_it != vocab_.end() && merged_it != vocab_.end(),
               "{}: field 'model.merges[{}]' (\"{}\" + \"{}\") uses a token missing from "
               "model.vocab",
               source, rank, left, right);
    // Later duplicates win, as when `tokenizers` collects the merges into a map.
    merges_[pair_key(left_it->second, right_it->second)] =
        Merge{static_cast<int32_t>(rank), merged_it->second};
  }
}

void BpeTokenizer::parse_added_tokens(const Json& root, const JsonFields& fields) {
  const std::string& source = fields.source();
  const Json* list = fields.find(root, "", "added_tokens");
  if (list == nullptr) return;
  KILN_CHECK(list->is_array(), "{}: field 'added_tokens' must be an array", source);
  // `tokenizers` only checks the ids written here: a token already in the model's vocabulary
  // gets that id and the others are numbered after the vocabulary in file order. Real files
  // agree with that numbering; following it keeps us equal to HF when one does not.
  const auto model_size = static_cast<int32_t>(vocab_.size());
  int32_t max_added_id = -1;
  std::unordered_map<std::string, size_t> index_by_content;
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const std::string path = fmt::format("added_tokens[{}]", i);
    AddedToken token;
    fields.token_id(fields.require(entry, path, "id"), path + ".id");
    token.content = fields.string(fields.require(entry, path, "content"), path + ".content");
    token.special = fields.flag(entry, path, "special", false);
    token.lstrip = fields.flag(entry, path, "lstrip", false);
    token.rstrip = fields.flag(entry, path, "rstrip", false);
    token.normalized = fields.flag(entry, path, "normalized", !token.special);
    // single_word needs Unicode's \w tables; refusing is better than matching differently.
    KILN_CHECK(!fields.flag(entry, path, "single_word", false),
               "{}: field '{}.single_word' = true is not supported", source, path);
    KILN_CHECK(!token.content.empty(), "{}: field '{}.content' is empty", source, path);
    const auto seen = index_by_content.find(token.content);
    if (const auto in_vocab = vocab_.find(token.content); in_vocab != vocab_.end()) {
      token.id = in_vocab->second;
    } else if (seen != index_by_content.end()) {
      token.id = added_tokens_[seen->second].id;
    } else {
      token.id = max_added_id >= model_size ? max_added_id + 1 : model_size;
    }
    max_added_id = std::max(max_added_id, token.id);
    if (static_cast<size_t>(token.id) >= tokens_.size()) tokens_.resize(token.id + 1);
    // Added tokens take precedence over the model's vocabulary when decoding, as in HF.
    tokens_[token.id] = TokenEntry{byte_level_decode(token.content), true, token.special};
    if (seen != index_by_content.end()) {
      added_tokens_[seen->second] = std::move(token);  // a repeated token's last entry wins
    } else {
      index_by_content.emplace(token.content, added_tokens_.size());
      added_tokens_.push_back(std::move(token));
    }
  }
  for (uint32_t i = 0; i < added_tokens_.size(); ++i) {
    const auto first = static_cast<unsigned char>(added_tokens_[i].content[0]);
    added_by_first_byte_[first].push_back(i);
  }
  for (auto& bucket : added_by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
      return added_tokens_[a].content.size() > added_tokens_[b].content.size();
    });
  }
}

void BpeTokenizer::parse_pre_tokenizer(const Json& root, const JsonFields& fields) {
  const std::string& source = fields.source();
  const Json& pre = fields.require(root, "", "pre_tokenizer");
  std::vector<std::pair<const Json*, std::string>> steps;
  const std::string type =
      fields.string(fields.require(pre, "pre_tokenizer", "type"), "pre_tokenizer.type");
  if (type == "Sequence") {
    const Json& list = fields.require(pre, "pre_tokenizer", "pretokenizers");
    KILN_CHECK(list.is_array(), "{}: field 'pre_tokenizer.pretokenizers' must be an array", source);
    for (size_t i = 0; i < list.size(); ++i)
      steps.emplace_back(&list[i], fmt::format("pre_tokenizer.pretokenizers[{}]", i));
  } else {
    steps.emplace_back(&pre, "pre_tokenizer");
  }
  bool byte_level_seen = false;
  for (const auto& [step, path] : steps) {
    const std::string step_type =
        fields.string(fields.require(*step, path, "type"), path + ".type");
    // Splitting after ByteLevel would see the mapped characters, which nothing here models.
    KILN_CHECK(!byte_level_seen, "{}: field '{}.type' = \"{}\" after ByteLevel is not supported",
               source, path, step_type);
    if (step_type == "Split") {
      KILN_CHECK(!bloom_split_, "{}: field '{}': only one Split is supported", source, path);
      const Json& pattern = fields.require(*step, path, "pattern");
      const Json* regex = fields.find(pattern, path + ".pattern", "Regex");
      KILN_CHECK(
          regex != nullptr && regex->is_string() && regex->get<std::string>() == kBloomSplitPattern,
          "{}: field '{}.pattern' = {} is not supported; only BLOOM's Regex \"{}\" is", source,
          path, pattern.dump(), kBloomSplitPattern);
      const Json* behavior = fields.find(*step, path, "behavior");
      KILN_CHECK(behavior != nullptr && behavior->is_string() &&
                     behavior->get<std::string>() == "Isolated",
                 "{}: field '{}.behavior' must be \"Isolated\"", source, path);
      KILN_CHECK(!fields.flag(*step, path, "invert", false),
                 "{}: field '{}.invert' = true is not supported", source, path);
      bloom_split_ = true;
    } else if (step_type == "ByteLevel") {
      // `tokenizers` defaults use_regex to true, i.e. GPT-2's regex with \p{L}/\p{N} classes.
      KILN_CHECK(!fields.flag(*step, path, "use_regex", true),
                 "{}: field '{}.use_regex' = true (GPT-2 regex split) is not supported", source,
                 path);
      add_prefix_space_ = fields.flag(*step, path, "add_prefix_space", true);
      byte_level_seen = true;
    } else {
      KILN_FAIL("{}: field '{}.type' = \"{}\" is not supported (expected Split or ByteLevel)",
                source, path, step_type);
    }
  }
  KILN_CHECK(byte_level_seen, "{}: field 'pre_tokenizer' has no ByteLevel step", source);
}

void BpeTokenizer::parse_post_processor(const Json& root, const JsonFields& fields) {
  const std::string& source = fields.source();
  const Json* post = fields.find(root, "", "post_processor");
  if (post == nullptr) return;
  const std::string type =
      fields.string(fields.require(*post, "post_processor", "type"), "post_processor.type");
  if (type == "ByteLevel") return;  // only trims offsets; ids are unchanged
  KILN_CHECK(type == "TemplateProcessing",
             "{}: field 'post_processor.type' = \"{}\" is not supported", source, type);
  const Json& single = fields.require(*post, "post_processor", "single");
  KILN_CHECK(single.is_array(), "{}: field 'post_processor.single' must be an array", source);
  const Json* specials = fields.find(*post, "post_processor", "special_tokens");
  bool sequence_seen = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string path = fmt::format("post_processor.single[{}]", i);
    if (fields.find(single[i], path, "Sequence") != nullptr) {
      KILN_CHECK(!sequence_seen, "{}: field '{}' repeats the sequence", source, path);
      sequence_seen = true;
      continue;
    }
    const Json& special = fields.require(single[i], path, "SpecialToken");
    const std::string name = fields.string(fields.require(special, path + ".SpecialToken", "id"),
                                           path + ".SpecialToken.id");
    KILN_CHECK(specials != nullptr && specials->is_object() && specials->contains(name),
               "{}: field '{}' names \"{}\", which post_processor.special_tokens lacks", source,
               path, name);
    const std::string ids_path = fmt::format("post_processor.special_tokens[\"{}\"]", name);
    const Json& ids = fields.require((*specials)[name], ids_path, "ids");
    KILN_CHECK(ids.is_array(), "{}: field '{}.ids' must be an array", source, ids_path);
    for (const Json& id : ids) {
      (sequence_seen ? suffix_ids_ : prefix_ids_).push_back(fields.token_id(id, ids_path + ".ids"));
    }
  }
  KILN_CHECK(sequence_seen, "{}: field 'post_processor.single' has no Sequence", source);
}

// Leftmost-longest matching as `tokenizers` does with Aho-Corasick, honoring lstrip/rstrip.
void BpeTokenizer::split_added(std::string_view text, bool normalized_pass,
                               std::vector<Segment>& out) const {
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* found = nullptr;
    for (uint32_t index : added_by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& candidate = added_tokens_[index];
      if (candidate.normalized == normalized_pass &&
          text.compare(pos, candidate.content.size(), candidate.content) == 0) {
        found = &candidate;
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + found->content.size();
    if (found->lstrip) start = strip_whitespace_before(text, start_offset, start);
    if (found->rstrip) stop = skip_whitespace_after(text, stop);
    if (start_offset < start) out.push_back({text.substr(start_offset, start - start_offset), -1});
    out.push_back({text.substr(start, stop - start), found->id});
    start_offset = pos = stop;
  }
  if (start_offset < text.size()) out.push_back({text.substr(start_offset), -1});
}

// BPE on one pre-tokenized piece, merging the lowest-ranked adjacent pair first (leftmost on
// ties) exactly like `tokenizers`' Word::merge_all, so the same ids come out even where a
// different merge order would give a different segmentation.
void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int64_t>& ids) const {
  const bool prefix_space = add_prefix_space_ && piece.front() != ' ';
  if (ignore_merges_) {
    const ByteLevelTables& tables = byte_level_tables();
    std::string mapped = prefix_space ? tables.byte_to_utf8[' '] : std::string();
    for (char byte : piece) mapped += tables.byte_to_utf8[static_cast<unsigned char>(byte)];
    if (const auto it = vocab_.find(mapped); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool removed;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size() + 1);
  const auto push_byte = [&](unsigned char byte) {
    int32_t id = byte_ids_[byte];
    if (id < 0) {
      if (unk_id_ < 0) return;  // HF drops characters it cannot represent when there is no unk
      if (fuse_unk_ && !symbols.empty() && symbols.back().id == unk_id_) return;
      id = unk_id_;
    }
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, false});
  };
  if (prefix_space) push_byte(' ');
  for (char byte : piece) push_byte(static_cast<unsigned char>(byte));
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push_pair = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    const int32_t right_pos = left.next;
    Symbol& right = symbols[right_pos];
    // Entries go stale when a neighbour was merged first; the pair must still produce this id.
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.merged_id != top.merged_id) continue;
    left.id = top.merged_id;
    left.next = right.next;
    right.removed = true;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& symbol : symbols) {
    if (!symbol.removed) ids.push_back(symbol.id);
  }
}

std::vector<int64_t> BpeTokenizer::encode(const std::string& text) const {
  std::vector<Segment> first_pass;
  split_added(text, /*normalized_pass=*/false, first_pass);
  // Without a normalizer the normalized text is the raw text, so the second pass (tokens marked
  // normalized) runs on the ordinary stretches left by the first, as in `tokenizers`.
  std::vector<Segment> segments;
  for (const Segment& segment : first_pass) {
    if (segment.added_id >= 0) {
      segments.push_back(segment);
    } else {
      split_added(segment.text, /*normalized_pass=*/true, segments);
    }
  }
  std::vector<int64_t> ids = prefix_ids_;
  std::vector<std::string_view> pieces;
  for (const Segment& segment : segments) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
      continue;
    }
    pieces.clear();
    if (bloom_split_) {
      split_bloom(segment.text, pieces);
    } else {
      pieces.push_back(segment.text);
    }
    for (std::string_view piece : pieces) {
      if (!piece.empty()) encode_piece(piece, ids);
    }
  }
  ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int64_t id : ids) {
    // HF drops ids it has no token for instead of failing.
    if (id < 0 || id >= vocab_size()) continue;
    const TokenEntry& entry = tokens_[static_cast<size_t>(id)];
    if (!entry.known || (skip_special && entry.special)) continue;
    bytes += entry.bytes;
  }
  return utf8_lossy(bytes);
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const std::string& tokenizer_json,
                                              const std::string& source) {
  try {
    return std::make_unique<BpeTokenizer>(tokenizer_json, source);
  } catch (const Json::exception& e) {
    // The field readers check types first; this only catches what they could not foresee.
    KILN_FAIL("{}: unexpected content in tokenizer.json ({})", source, e.what());
  }
}

}  // namespace kiln
