// IncrementalDetokenizer against Tokenizer::decode of the whole sequence (itself checked against
// HuggingFace in test_tokenizer.cc) and against HF's reference text: the streamed pieces must add
// up to decode's text exactly, arrive as soon as they are final, be valid UTF-8, and cost a
// bounded decode per id however long the sequence.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "../models/parity_util.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

std::string ids_text(const std::vector<int64_t>& ids) { return Json(ids).dump(); }

// Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), written out here so
// that the check does not lean on the tokenizer's own decoder.
bool is_valid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    const auto lead = static_cast<unsigned char>(text[pos]);
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (lead < 0x80) {
      length = 1;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return false;
    }
    if (text.size() - pos < length) return false;
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[pos + k]);
      if (next < (k == 1 ? low : 0x80) || next > (k == 1 ? high : 0xBF)) return false;
    }
    pos += length;
  }
  return true;
}

// Forwards to a real tokenizer and records how many ids the detokenizer decodes at once.
class CountingTokenizer final : public Tokenizer {
 public:
  explicit CountingTokenizer(const Tokenizer& inner) : inner_(inner) {}
  TokenizerKind kind() const override { return inner_.kind(); }
  std::vector<int64_t> encode(const std::string& text) const override {
    return inner_.encode(text);
  }
  std::string decode(const std::vector<int64_t>& ids, bool skip_special) const override {
    longest_ = std::max(longest_, ids.size());
    ++calls_;
    return inner_.decode(ids, skip_special);
  }
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  const std::string& source_bytes() const override { return inner_.source_bytes(); }

  void reset() const { longest_ = calls_ = 0; }
  size_t longest() const { return longest_; }
  size_t calls() const { return calls_; }

 private:
  const Tokenizer& inner_;
  mutable size_t longest_ = 0;
  mutable size_t calls_ = 0;
};

// Everything but an unfinished tail of at most three U+FFFD must be out after each id.
bool only_replacements(std::string_view tail) {
  if (tail.size() > 3 * kReplacement.size()) return false;
  for (size_t pos = 0; pos < tail.size(); pos += kReplacement.size()) {
    if (tail.substr(pos, kReplacement.size()) != kReplacement) return false;
  }
  return true;
}

struct Streamed {
  std::vector<std::string> pieces;  // from push, then the one from finish
  std::string text;
};

Streamed stream(IncrementalDetokenizer& detokenizer, const std::vector<int64_t>& ids) {
  Streamed out;
  for (int64_t id : ids) {
    out.pieces.push_back(detokenizer.push(id));
    out.text += out.pieces.back();
  }
  out.pieces.push_back(detokenizer.finish());
  out.text += out.pieces.back();
  return out;
}

// Streams `ids` and checks the contract after every id against decode of the ids so far
// (quadratic, so only for short sequences). Returns false after the first failure.
bool expect_streams_like_decode(const Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  IncrementalDetokenizer detokenizer(tokenizer);
  std::string streamed;
  std::vector<int64_t> prefix;
  for (int64_t id : ids) {
    const std::string piece = detokenizer.push(id);
    prefix.push_back(id);
    streamed += piece;
    EXPECT_TRUE(is_valid_utf8(piece)) << ids_text(prefix);
    const std::string decoded = tokenizer.decode(prefix);
    if (!decoded.starts_with(streamed) || !only_replacements(decoded.substr(streamed.size()))) {
      ADD_FAILURE() << "after " << ids_text(prefix) << " streamed " << Json(streamed).dump()
                    << ", decode gives " << Json(decoded).dump();
      return false;
    }
  }
  const std::string rest = detokenizer.finish();
  const std::string decoded = tokenizer.decode(ids);
  EXPECT_EQ(streamed + rest, decoded) << ids_text(ids);
  return streamed + rest == decoded;
}

std::unique_ptr<Tokenizer> load(const std::string& model) {
  return load_tokenizer_dir(test::fixture(model));
}

// The id byte-level BPE gives one raw byte (encode takes invalid UTF-8 byte by byte).
int64_t byte_id(const Tokenizer& bloom, unsigned char byte) {
  const std::vector<int64_t> ids = bloom.encode(std::string(1, static_cast<char>(byte)));
  EXPECT_EQ(ids.size(), 1u) << static_cast<int>(byte);
  return ids.empty() ? -1 : ids[0];
}

// ---- reference rows ---------------------------------------------------------------------------

void expect_reference_rows_stream(const std::string& model) {
  const auto tokenizer = load(model);
  const std::vector<test::ReferenceRow> rows = test::load_tokenizer_reference(model);
  ASSERT_EQ(rows.size(), 1727u);
  size_t matched = 0;
  for (const test::ReferenceRow& row : rows)
    matched += expect_streams_like_decode(*tokenizer, row.ids);
  EXPECT_EQ(matched, rows.size());
}

TEST(DetokenizerReference, T5RowsStreamLikeDecode) { expect_reference_rows_stream("t5-tiny"); }

TEST(DetokenizerReference, BloomRowsStreamLikeDecode) {
  expect_reference_rows_stream("bloom-tiny");
}

// BLOOM's decode gives back HF's text, so the stream must too, piece by valid piece.
TEST(DetokenizerReference, BloomRowsStreamToHuggingFaceText) {
  const auto tokenizer = load("bloom-tiny");
  for (const test::ReferenceRow& row : test::load_tokenizer_reference("bloom-tiny")) {
    IncrementalDetokenizer detokenizer(*tokenizer);
    const Streamed out = stream(detokenizer, row.ids);
    EXPECT_EQ(out.text, row.text) << ids_text(row.ids);
    for (const std::string& piece : out.pieces) {
      EXPECT_TRUE(is_valid_utf8(piece)) << ids_text(row.ids);
      EXPECT_EQ(piece.find(kReplacement), std::string::npos) << ids_text(row.ids);
    }
  }
}

// ---- characters split over tokens -------------------------------------------------------------

TEST(DetokenizerBloom, SplitCharactersArriveWhole) {
  const auto tokenizer = load("bloom-tiny");
  const std::string text =
      "emoji \xF0\x9F\x9A\x80\xF0\x9F\x94\xA5 and \xE2\x9C\x93, \xE4\xBD\xA0\xE5\xA5\xBD";
  const std::vector<int64_t> ids = tokenizer->encode(text);
  // The test means something only if the rocket's four bytes really are several tokens.
  const std::vector<int64_t> rocket = tokenizer->encode("\xF0\x9F\x9A\x80");
  ASSERT_GT(rocket.size(), 1u);
  IncrementalDetokenizer detokenizer(*tokenizer);
  const Streamed out = stream(detokenizer, ids);
  EXPECT_EQ(out.text, text);
  size_t rocket_pieces = 0;
  for (const std::string& piece : out.pieces) {
    EXPECT_TRUE(is_valid_utf8(piece)) << Json(piece).dump();
    EXPECT_EQ(piece.find(kReplacement), std::string::npos) << Json(piece).dump();
    rocket_pieces += piece.find("\xF0\x9F\x9A\x80") != std::string::npos;
  }
  EXPECT_EQ(rocket_pieces, 1u);
  // Nothing is held back at the end of complete text.
  EXPECT_EQ(out.pieces.back(), "");
}

TEST(DetokenizerBloom, IgnoredIdsInsideACharacterDoNotBreakIt) {
  const auto tokenizer = load("bloom-tiny");
  const int64_t eos = 2;  // </s>, special
  const std::vector<int64_t> ids = {byte_id(*tokenizer, 0xF0),
                                    9999,
                                    byte_id(*tokenizer, 0x9F),
                                    -1,
                                    eos,
                                    byte_id(*tokenizer, 0x9A),
                                    byte_id(*tokenizer, 0x80)};
  IncrementalDetokenizer detokenizer(*tokenizer);
  const Streamed out = stream(detokenizer, ids);
  EXPECT_EQ(out.pieces, (std::vector<std::string>{"", "", "", "", "", "", "\xF0\x9F\x9A\x80", ""}));
}

TEST(DetokenizerBloom, DanglingBytesAreFlushedAsDecodeRendersThem) {
  const auto tokenizer = load("bloom-tiny");
  const std::vector<int64_t> ids = {68, byte_id(*tokenizer, 0xF0), byte_id(*tokenizer, 0x9F)};
  IncrementalDetokenizer detokenizer(*tokenizer);
  EXPECT_EQ(detokenizer.push(ids[0]), "a");
  EXPECT_EQ(detokenizer.push(ids[1]), "");
  EXPECT_EQ(detokenizer.push(ids[2]), "");
  // A truncated sequence is one U+FFFD (its maximal subpart), as in HF's lossy decode.
  EXPECT_EQ(detokenizer.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(tokenizer->decode(ids), "a\xEF\xBF\xBD");
  // finish() starts a new sequence. A trailing U+FFFD waits for the next id even when it is a
  // stray continuation byte that nothing could complete.
  EXPECT_EQ(detokenizer.push(byte_id(*tokenizer, 0x9A)), "");
  EXPECT_EQ(detokenizer.push(68),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(detokenizer.finish(), "");
}

// ---- SentencePiece spaces ---------------------------------------------------------------------

TEST(DetokenizerT5, SpacesAppearAsSoonAsTheyAreFinal) {
  const auto tokenizer = load("t5-tiny");
  const int64_t space = 159, r = 6, colon = 3, eos = 1, sentinel = 259;  // "▁", "▁r", ":"
  ASSERT_EQ(tokenizer->decode({r, space, space, r}), "r   r");
  const std::vector<std::vector<int64_t>> cases = {
      {r, space, space, r},  {space, space, r, colon}, {eos, space, r, space},
      {sentinel, r, eos, r}, {colon, space, eos, r},   {space, 300, -4, space, colon, r},
  };
  for (const auto& ids : cases) expect_streams_like_decode(*tokenizer, ids);
  IncrementalDetokenizer detokenizer(*tokenizer);
  EXPECT_EQ(detokenizer.push(r), "r");
  EXPECT_EQ(detokenizer.push(space), " ");
  EXPECT_EQ(detokenizer.push(r), " r");
}

// ---- random sequences -------------------------------------------------------------------------

std::vector<int64_t> random_ids(std::mt19937& rng, const std::vector<std::vector<int64_t>>& pools,
                                size_t max_length) {
  std::uniform_int_distribution<size_t> length_dist(0, max_length);
  std::uniform_int_distribution<size_t> pool_dist(0, pools.size() - 1);
  std::vector<int64_t> ids(length_dist(rng));
  for (int64_t& id : ids) {
    const std::vector<int64_t>& pool = pools[pool_dist(rng)];
    id = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
  }
  return ids;
}

std::vector<int64_t> id_range(int64_t begin, int64_t end) {
  std::vector<int64_t> ids;
  for (int64_t id = begin; id < end; ++id) ids.push_back(id);
  return ids;
}

std::vector<std::vector<int64_t>> bloom_pools(const Tokenizer& bloom) {
  std::vector<int64_t> continuation, lead, multibyte;
  for (int byte = 0x80; byte <= 0xBF; ++byte) continuation.push_back(byte_id(bloom, byte));
  for (int byte = 0xC0; byte <= 0xFF; ++byte) lead.push_back(byte_id(bloom, byte));
  for (const char* text : {"\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x9A\x80", "\xE4\xBD\xA0",
                           "\xEF\xBF\xBD", "\xE2\x9C\x93 \xF0\x9F\x94\xA5"}) {
    for (int64_t id : bloom.encode(text)) multibyte.push_back(id);
  }
  const int64_t vocab = bloom.vocab_size();
  return {id_range(0, vocab), continuation,           lead, multibyte, multibyte,
          {0, 1, 2, 3},       {-1, vocab, vocab + 27}};
}

TEST(DetokenizerRandom, BloomSequencesStreamLikeDecode) {
  const auto tokenizer = load("bloom-tiny");
  const auto pools = bloom_pools(*tokenizer);
  std::mt19937 rng(20240611);
  size_t matched = 0;
  constexpr int kSequences = 1500;
  for (int i = 0; i < kSequences; ++i) {
    matched += expect_streams_like_decode(*tokenizer, random_ids(rng, pools, 60));
  }
  EXPECT_EQ(matched, static_cast<size_t>(kSequences));
}

TEST(DetokenizerRandom, T5SequencesStreamLikeDecode) {
  const auto tokenizer = load("t5-tiny");
  const int64_t vocab = tokenizer->vocab_size();
  const int64_t space = 159;
  const std::vector<std::vector<int64_t>> pools = {
      id_range(0, vocab),  id_range(3, 159),       {space}, {space},
      {0, 1, 2, 200, 259}, {-1, vocab, vocab + 27}};
  std::mt19937 rng(77);
  size_t matched = 0;
  constexpr int kSequences = 1500;
  for (int i = 0; i < kSequences; ++i) {
    matched += expect_streams_like_decode(*tokenizer, random_ids(rng, pools, 40));
  }
  EXPECT_EQ(matched, static_cast<size_t>(kSequences));
}

// ---- long sequences: exact and bounded --------------------------------------------------------

void expect_long_stream_exact_and_bounded(const Tokenizer& tokenizer,
                                          const std::vector<int64_t>& ids) {
  const CountingTokenizer counting(tokenizer);
  IncrementalDetokenizer detokenizer(counting);
  counting.reset();
  std::string streamed;
  for (int64_t id : ids) {
    const std::string piece = detokenizer.push(id);
    EXPECT_TRUE(is_valid_utf8(piece));
    streamed += piece;
  }
  streamed += detokenizer.finish();
  EXPECT_EQ(streamed, tokenizer.decode(ids));
  // A constant that does not grow with the sequence; decoding everything would reach ids.size().
  EXPECT_LE(counting.longest(), 64u);
  EXPECT_LE(counting.calls(), 8 * ids.size());
}

TEST(DetokenizerLong, BloomFiveThousandIds) {
  const auto tokenizer = load("bloom-tiny");
  const auto pools = bloom_pools(*tokenizer);
  std::mt19937 rng(5);
  std::vector<int64_t> ids;
  const std::vector<test::ReferenceRow> rows = test::load_tokenizer_reference("bloom-tiny");
  while (ids.size() < 5000) {
    const auto& row = rows[std::uniform_int_distribution<size_t>(0, rows.size() - 1)(rng)];
    ids.insert(ids.end(), row.ids.begin(), row.ids.end());
    const std::vector<int64_t> noise = random_ids(rng, pools, 6);
    ids.insert(ids.end(), noise.begin(), noise.end());
  }
  expect_long_stream_exact_and_bounded(*tokenizer, ids);
}

TEST(DetokenizerLong, T5FiveThousandIds) {
  const auto tokenizer = load("t5-tiny");
  std::mt19937 rng(6);
  std::vector<int64_t> ids(3000, 159);  // a long run of bare "▁" first, which renders nothing
  while (ids.size() < 8000) ids.push_back(std::uniform_int_distribution<int64_t>(0, 300)(rng));
  expect_long_stream_exact_and_bounded(*tokenizer, ids);
}

// Text that ends in U+FFFD after every id keeps the window from resetting, which is where a
// naive streamer re-decodes everything: runs of stray bytes, literal U+FFFD, and a character
// cut so that no token boundary falls between characters.
TEST(DetokenizerLong, BloomTextThatNeverSettles) {
  const auto tokenizer = load("bloom-tiny");
  std::mt19937 rng(9);
  std::vector<int64_t> stray;
  for (int i = 0; i < 3000; ++i) {
    stray.push_back(byte_id(*tokenizer, std::uniform_int_distribution<int>(0x80, 0xFF)(rng)));
  }
  expect_long_stream_exact_and_bounded(*tokenizer, stray);
  for (int64_t limit : {3000, 40, 34, 33, 32, 10}) {
    std::vector<int64_t> prefix(stray.begin(), stray.begin() + std::min<int64_t>(limit, 3000));
    expect_streams_like_decode(*tokenizer, prefix);
  }

  std::vector<int64_t> literal;
  const std::vector<int64_t> replacement = tokenizer->encode("\xEF\xBF\xBD");
  while (literal.size() < 2000)
    literal.insert(literal.end(), replacement.begin(), replacement.end());
  expect_long_stream_exact_and_bounded(*tokenizer, literal);
  literal.resize(120);
  expect_streams_like_decode(*tokenizer, literal);

  // A token holding the bytes AC E2 82: after E2 82, every push completes one euro sign and
  // starts the next, so each boundary between tokens falls inside a character.
  Json json = Json::parse(tokenizer->source_bytes());
  std::string content;
  for (unsigned char byte : {0xAC, 0xE2, 0x82}) {
    const int64_t id = byte_id(*tokenizer, byte);
    for (const auto& [key, value] : json["model"]["vocab"].items()) {
      if (value.get<int64_t>() == id) content += key;
    }
  }
  json["added_tokens"].push_back(
      {{"id", 420}, {"content", content}, {"special", false}, {"normalized", false}});
  const auto spliced = make_bpe_tokenizer(json.dump(), "spliced");
  ASSERT_EQ(spliced->decode({420}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  std::vector<int64_t> euros = {byte_id(*tokenizer, 0xE2), byte_id(*tokenizer, 0x82)};
  while (euros.size() < 3000) euros.push_back(420);
  expect_long_stream_exact_and_bounded(*spliced, euros);
  euros.resize(100);
  EXPECT_TRUE(expect_streams_like_decode(*spliced, euros));
}

}  // namespace
}  // namespace kiln
