// Tokenizers against HuggingFace's ids in the fixtures' tokenizer_reference.jsonl, round trips,
// and refusal of files the tokenizers do not support.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include "../models/parity_util.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace {

using Json = nlohmann::json;

std::string fixture_path(const std::string& relative) {
  return std::string(KILN_FIXTURES_DIR) + "/" + relative;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

std::string ids_text(const std::vector<int64_t>& ids) { return Json(ids).dump(); }

// The message of the kiln::Error `action` throws, or "" when it throws nothing.
std::string error_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_reference_ids(const std::string& model) {
  const std::vector<test::ReferenceRow> rows = test::load_tokenizer_reference(model);
  ASSERT_EQ(rows.size(), 1727u) << model;
  const auto tokenizer = load_tokenizer_dir(fixture_path(model));
  size_t matched = 0;
  std::string first_mismatch;
  for (const test::ReferenceRow& row : rows) {
    const std::vector<int64_t> ids = tokenizer->encode(row.text);
    if (ids == row.ids) {
      ++matched;
    } else if (first_mismatch.empty()) {
      first_mismatch =
          Json(row.text).dump() + ": expected " + ids_text(row.ids) + ", got " + ids_text(ids);
    }
  }
  std::cout << "[ " << model << " ] " << matched << "/" << rows.size()
            << " reference rows encode to HF's ids\n";
  EXPECT_EQ(matched, rows.size()) << "first mismatch " << first_mismatch;
}

TEST(TokenizerReference, T5EveryRowMatchesHuggingFace) { expect_reference_ids("t5-tiny"); }

TEST(TokenizerReference, BloomEveryRowMatchesHuggingFace) { expect_reference_ids("bloom-tiny"); }

TEST(TokenizerReference, BloomDecodesReferenceIdsToText) {
  const auto tokenizer = load_tokenizer_dir(fixture_path("bloom-tiny"));
  size_t matched = 0;
  const std::vector<test::ReferenceRow> rows = test::load_tokenizer_reference("bloom-tiny");
  for (const test::ReferenceRow& row : rows) {
    const std::string text = tokenizer->decode(row.ids);
    EXPECT_EQ(text, row.text) << ids_text(row.ids);
    matched += text == row.text;
  }
  EXPECT_EQ(matched, rows.size());
}

// SentencePiece normalizes whitespace (NFKC turns U+200B into a space too), so decoding gives
// back the text with runs of whitespace collapsed and the ends trimmed.
std::string collapse_whitespace(std::string text) {
  for (size_t at; (at = text.find("\u200b")) != std::string::npos;) text.replace(at, 3, " ");
  std::istringstream words(text);
  std::string out, word;
  while (words >> word) out += (out.empty() ? "" : " ") + word;
  return out;
}

TEST(TokenizerReference, T5DecodesReferenceIds) {
  const auto tokenizer = load_tokenizer_dir(fixture_path("t5-tiny"));
  EXPECT_EQ(tokenizer->decode({6, 17, 8, 3, 31, 156, 41, 157, 73, 1}), "reverse: suvogi");
  EXPECT_EQ(tokenizer->decode({6, 17, 8, 3, 31, 156, 41, 157, 73, 1}, false),
            "reverse: suvogi</s>");
  size_t checked = 0;
  for (const test::ReferenceRow& row : test::load_tokenizer_reference("t5-tiny")) {
    // Characters outside the vocabulary came out as <unk>, which decoding drops.
    if (std::find(row.ids.begin(), row.ids.end(), 2) != row.ids.end()) continue;
    EXPECT_EQ(tokenizer->decode(row.ids), collapse_whitespace(row.text)) << ids_text(row.ids);
    ++checked;
  }
  EXPECT_GT(checked, 1700u);
}

TEST(Tokenizer, KindsSizesAndSourceBytes) {
  const auto t5 = load_tokenizer_dir(fixture_path("t5-tiny"));
  const auto bloom = load_tokenizer_dir(fixture_path("bloom-tiny"));
  EXPECT_EQ(t5->kind(), TokenizerKind::kSentencePiece);
  EXPECT_EQ(bloom->kind(), TokenizerKind::kByteLevelBpe);
  // 160 pieces + 100 sentinels; the models' embeddings are padded beyond (288 and 448).
  EXPECT_EQ(t5->vocab_size(), 260);
  EXPECT_EQ(bloom->vocab_size(), 420);
  EXPECT_EQ(t5->source_bytes(), read_file(fixture_path("t5-tiny/spiece.model")));
  EXPECT_EQ(bloom->source_bytes(), read_file(fixture_path("bloom-tiny/tokenizer.json")));
}

TEST(Tokenizer, RebuildsFromStoredBytesLikeAPlan) {
  for (const std::string model : {"t5-tiny", "bloom-tiny"}) {
    const auto original = load_tokenizer_dir(fixture_path(model));
    const auto rebuilt = make_tokenizer(original->kind(), original->source_bytes(), "plan");
    for (const test::ReferenceRow& row : test::load_tokenizer_reference(model)) {
      ASSERT_EQ(rebuilt->encode(row.text), row.ids) << model << " " << row.text;
    }
  }
}

TEST(Tokenizer, T5SpecialTokensAreSplitOutFirst) {
  const auto tokenizer = load_tokenizer_dir(fixture_path("t5-tiny"));
  // T5Tokenizer numbers sentinels down from the top: <extra_id_N> = 160 pieces + 99 - N.
  for (int n = 0; n < 100; ++n) {
    const std::string sentinel = "<extra_id_" + std::to_string(n) + ">";
    EXPECT_EQ(tokenizer->encode(sentinel), (std::vector<int64_t>{259 - n, 1})) << sentinel;
    EXPECT_EQ(tokenizer->decode({259 - n}, false), sentinel);
    EXPECT_EQ(tokenizer->decode({259 - n}), "");
  }
  // pad/eos/unk agree with the ids tokenizer.json gives them. (Its <extra_id_*> entries sit at
  // 4..103, on top of SentencePiece pieces the reference ids use, so they cannot be right.)
  const Json json = Json::parse(read_file(fixture_path("t5-tiny/tokenizer.json")));
  size_t checked = 0;
  for (const Json& added : json.at("added_tokens")) {
    const std::string content = added.at("content").get<std::string>();
    if (content.rfind("<extra_id_", 0) == 0) continue;
    EXPECT_EQ(tokenizer->encode(content), (std::vector<int64_t>{added.at("id").get<int64_t>(), 1}))
        << content;
    ++checked;
  }
  EXPECT_EQ(checked, 3u);

  const std::vector<int64_t> fill = tokenizer->encode("fill");
  const std::vector<int64_t> here = tokenizer->encode("here");
  std::vector<int64_t> expected(fill.begin(), fill.end() - 1);
  expected.push_back(254);  // <extra_id_5>
  expected.insert(expected.end(), here.begin(), here.end());
  EXPECT_EQ(tokenizer->encode("fill <extra_id_5> here"), expected);
  EXPECT_EQ(tokenizer->encode("fill<extra_id_5>here"), expected);
  EXPECT_EQ(tokenizer->decode(expected), "fill here");
  EXPECT_EQ(tokenizer->decode(expected, false), "fill<extra_id_5> here</s>");
  // Not sentinels: out of range or not written canonically.
  for (const std::string not_sentinel : {"<extra_id_100>", "<extra_id_05>", "<extra_id_>"}) {
    const std::vector<int64_t> ids = tokenizer->encode(not_sentinel);
    EXPECT_GT(ids.size(), 2u) << not_sentinel;
    for (int64_t id : ids) EXPECT_LT(id, 160) << not_sentinel;
  }
  EXPECT_EQ(tokenizer->encode("").size(), 1u);
  // Ids the tokenizer has no token for (the model's padded rows) are dropped, as HF does.
  EXPECT_EQ(tokenizer->decode({270, -1, 6, 17, 8}), "reverse");
}

TEST(Tokenizer, BloomSpecialTokensAreSplitOutFirst) {
  const auto tokenizer = load_tokenizer_dir(fixture_path("bloom-tiny"));
  const std::vector<int64_t> hello = tokenizer->encode("hello world");
  std::vector<int64_t> expected = {1};
  expected.insert(expected.end(), hello.begin(), hello.end());
  expected.push_back(2);
  expected.push_back(3);
  EXPECT_EQ(tokenizer->encode("<s>hello world</s><pad>"), expected);
  EXPECT_EQ(tokenizer->decode(expected), "hello world");
  EXPECT_EQ(tokenizer->decode(expected, false), "<s>hello world</s><pad>");
  EXPECT_EQ(tokenizer->encode("<unk>"), (std::vector<int64_t>{0}));
  EXPECT_EQ(tokenizer->encode(""), (std::vector<int64_t>{}));
  EXPECT_EQ(tokenizer->decode({9999, -5, 68}), "a");
}

const std::string& bloom_json_text() {
  static const std::string text = read_file(fixture_path("bloom-tiny/tokenizer.json"));
  return text;
}

std::string bloom_json_with(const std::function<void(Json&)>& edit) {
  Json json = Json::parse(bloom_json_text());
  edit(json);
  return json.dump();
}

std::vector<int64_t> concat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// Pipeline options BLOOM does not use, checked by what they mean rather than by stored ids
// (a differential run against `tokenizers` 0.23 covered them too).
TEST(Tokenizer, BpeOptionalPipelineSteps) {
  const auto base = make_bpe_tokenizer(bloom_json_text(), "base");

  const auto add_bos_eos = [](Json& j) {
    j["post_processor"]["single"] = Json::parse(R"([{"SpecialToken": {"id": "<s>"}},
        {"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "</s>"}}])");
    j["post_processor"]["special_tokens"] =
        Json::parse(R"({"<s>": {"id": "<s>", "ids": [1]}, "</s>": {"id": "</s>", "ids": [2]}})");
  };
  const auto templated = make_bpe_tokenizer(bloom_json_with(add_bos_eos), "templated");
  EXPECT_EQ(templated->encode("hi there"), concat({{1}, base->encode("hi there"), {2}}));

  const auto add_prefix_space = [](Json& j) {
    j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  };
  const auto prefixed = make_bpe_tokenizer(bloom_json_with(add_prefix_space), "prefixed");
  EXPECT_EQ(prefixed->encode("hi"), base->encode(" hi"));
  EXPECT_EQ(prefixed->encode(" hi"), base->encode(" hi"));

  // lstrip/rstrip absorb the whitespace around the token; a new token is numbered after the
  // vocabulary whatever id the file wrote, as `tokenizers` does.
  const auto add_separator = [](Json& j) {
    j["added_tokens"].push_back(Json::parse(
        R"({"id": 9, "content": "<sep>", "special": true, "lstrip": true, "rstrip": true})"));
  };
  const auto stripping = make_bpe_tokenizer(bloom_json_with(add_separator), "stripping");
  EXPECT_EQ(stripping->encode("a \t<sep>  b"),
            concat({base->encode("a"), {420}, base->encode("b")}));
  EXPECT_EQ(stripping->decode(stripping->encode("a <sep> b"), false), "a<sep>b");

  // Older files write merges as "left right".
  const auto merges_as_strings = [](Json& j) {
    for (Json& merge : j["model"]["merges"]) {
      merge = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
    }
  };
  const auto legacy = make_bpe_tokenizer(bloom_json_with(merges_as_strings), "legacy");
  for (const test::ReferenceRow& row : test::load_tokenizer_reference("bloom-tiny")) {
    ASSERT_EQ(legacy->encode(row.text), row.ids) << row.text;
  }
}

// Random valid UTF-8 mixing 1- to 4-byte characters, biased towards the characters the BLOOM
// split treats specially.
std::string random_utf8(std::mt19937& rng) {
  static const std::vector<char32_t> interesting = {
      U' ',      U' ',      U'\t',     U'\n',     U'\r',     U'(',      U')',      U'|',
      U'.',      U',',      U'!',      U'?',      U'\u2026', U'\u3002', U'\uff0c', U'\u3001',
      U'\u0964', U'\u06d4', U'\u060c', U'\u00a0', U'\u3000', U'\u2028', U'\u200b', U'\u0085',
      U'<',      U'>',      U's',      U'/',      U'\u0120', U'\u0100'};
  std::uniform_int_distribution<int> length_dist(0, 40);
  std::uniform_int_distribution<int> kind_dist(0, 9);
  std::string out;
  const int length = length_dist(rng);
  for (int i = 0; i < length; ++i) {
    char32_t cp = 0;
    switch (kind_dist(rng)) {
      case 0:
      case 1:
      case 2:
        cp = interesting[std::uniform_int_distribution<size_t>(0, interesting.size() - 1)(rng)];
        break;
      case 3:
      case 4:
        cp = std::uniform_int_distribution<char32_t>(0x00, 0x7F)(rng);
        break;
      case 5:
      case 6:
        cp = std::uniform_int_distribution<char32_t>(0x80, 0x7FF)(rng);
        break;
      case 7:
      case 8:
        do {
          cp = std::uniform_int_distribution<char32_t>(0x800, 0xFFFF)(rng);
        } while (cp >= 0xD800 && cp <= 0xDFFF);
        break;
      default:
        cp = std::uniform_int_distribution<char32_t>(0x10000, 0x10FFFF)(rng);
        break;
    }
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
  return out;
}

TEST(Tokenizer, BloomDecodeInvertsEncode) {
  const auto tokenizer = load_tokenizer_dir(fixture_path("bloom-tiny"));
  std::vector<std::string> texts;
  for (const test::ReferenceRow& row : test::load_tokenizer_reference("bloom-tiny"))
    texts.push_back(row.text);
  texts.insert(texts.end(), {"", " ", "  ", "a  b", "<s></s>x<pad >", "( | )", "\xF0\x9F\x9A\x80"});
  std::mt19937 rng(1234);
  for (int i = 0; i < 3000; ++i) texts.push_back(random_utf8(rng));
  size_t matched = 0;
  for (const std::string& text : texts) {
    const std::vector<int64_t> ids = tokenizer->encode(text);
    for (int64_t id : ids) ASSERT_TRUE(id >= 0 && id < tokenizer->vocab_size()) << text;
    const std::string decoded = tokenizer->decode(ids, /*skip_special=*/false);
    EXPECT_EQ(decoded, text) << Json(text).dump();
    matched += decoded == text;
  }
  EXPECT_EQ(matched, texts.size());
}

TEST(Tokenizer, InvalidUtf8InputDoesNotCrash) {
  const std::string bad = "\xFF\xFE abc \xC3 \xE2\x82 \xED\xA0\x80 end\xF4";
  const auto bloom = load_tokenizer_dir(fixture_path("bloom-tiny"));
  // The raw bytes go through the byte-level model; decoding replaces them as HF's lossy UTF-8
  // conversion does (one U+FFFD per maximal invalid subpart).
  EXPECT_EQ(bloom->decode(bloom->encode(bad)),
            "\uFFFD\uFFFD abc \uFFFD \uFFFD \uFFFD\uFFFD\uFFFD end\uFFFD");
  const auto t5 = load_tokenizer_dir(fixture_path("t5-tiny"));
  const std::vector<int64_t> ids = t5->encode(bad);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), 1);
  t5->decode(ids);
}

// ---- bad input ------------------------------------------------------------------------------

void expect_bpe_error(const std::string& text, const std::string& needle) {
  EXPECT_THROW(make_bpe_tokenizer(text, "bad/tokenizer.json"), Error);
  const std::string message =
      error_message([&] { make_bpe_tokenizer(text, "bad/tokenizer.json"); });
  EXPECT_NE(message.find("bad/tokenizer.json"), std::string::npos) << message;
  EXPECT_NE(message.find(needle), std::string::npos) << message;
}

TEST(BadInputTokenizer, MalformedJson) {
  expect_bpe_error("{\"model\": ", "malformed JSON");
  expect_bpe_error("", "malformed JSON");
  expect_bpe_error(std::string("{\"a\":\"\xFF\"}"), "malformed JSON");
  expect_bpe_error("[1, 2]", "JSON object");
  expect_bpe_error("null", "JSON object");
  const std::string& good = bloom_json_text();
  for (size_t cut = 0; cut < good.size() - 1; cut += 61) {
    EXPECT_THROW(make_bpe_tokenizer(good.substr(0, cut), "cut.json"), Error) << cut;
  }
}

TEST(BadInputTokenizer, UnsupportedModelType) {
  // T5's tokenizer.json is a Unigram model.
  expect_bpe_error(read_file(fixture_path("t5-tiny/tokenizer.json")), "model.type");
  expect_bpe_error(bloom_json_with([](Json& j) { j["model"]["type"] = "WordPiece"; }), "WordPiece");
  expect_bpe_error(bloom_json_with([](Json& j) { j.erase("model"); }), "model");
  expect_bpe_error(bloom_json_with([](Json& j) { j["model"] = "BPE"; }), "model");
}

TEST(BadInputTokenizer, UnsupportedPipelineSteps) {
  expect_bpe_error(bloom_json_with([](Json& j) {
                     j["pre_tokenizer"] = {{"type", "Whitespace"}};
                   }),
                   "pre_tokenizer");
  expect_bpe_error(bloom_json_with([](Json& j) {
                     j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+";
                   }),
                   "pattern");
  expect_bpe_error(bloom_json_with([](Json& j) {
                     j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
                   }),
                   "behavior");
  expect_bpe_error(
      bloom_json_with([](Json& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; }),
      "use_regex");
  expect_bpe_error(bloom_json_with([](Json& j) { j["pre_tokenizer"] = nullptr; }), "pre_tokenizer");
  expect_bpe_error(bloom_json_with([](Json& j) {
                     j["normalizer"] = {{"type", "NFC"}};
                   }),
                   "normalizer");
  expect_bpe_error(bloom_json_with([](Json& j) {
                     j["decoder"] = {{"type", "Metaspace"}};
                   }),
                   "decoder.type");
  expect_bpe_error(bloom_json_with([](Json& j) {
                     j["post_processor"] = {{"type", "Bert"}};
                   }),
                   "post_processor");
  expect_bpe_error(bloom_json_with([](Json& j) { j["model"]["dropout"] = 0.1; }), "dropout");
  expect_bpe_error(bloom_json_with([](Json& j) { j["added_tokens"][0]["single_word"] = true; }),
                   "single_word");
}

TEST(BadInputTokenizer, WrongFieldValues) {
  expect_bpe_error(bloom_json_with([](Json& j) { j["model"]["vocab"]["a"] = "x"; }), "model.vocab");
  expect_bpe_error(bloom_json_with([](Json& j) { j["model"]["vocab"]["a"] = -1; }), "model.vocab");
  expect_bpe_error(bloom_json_with([](Json& j) { j["model"]["vocab"]["a"] = 1LL << 40; }),
                   "model.vocab");
  expect_bpe_error(bloom_json_with([](Json& j) { j["model"]["vocab"] = Json::array(); }),
                   "model.vocab");
  expect_bpe_error(bloom_json_with([](Json& j) {
                     j["model"]["merges"].push_back(Json::array({"zz", "qq"}));
                   }),
                   "model.merges");
  expect_bpe_error(bloom_json_with([](Json& j) { j["model"]["merges"].push_back(7); }),
                   "model.merges");
  expect_bpe_error(bloom_json_with([](Json& j) { j["model"]["unk_token"] = "<nope>"; }),
                   "unk_token");
  expect_bpe_error(bloom_json_with([](Json& j) { j["added_tokens"][1]["id"] = "one"; }),
                   "added_tokens[1].id");
  expect_bpe_error(bloom_json_with([](Json& j) { j["added_tokens"] = 5; }), "added_tokens");
}

// Random byte edits must give either a working tokenizer or a kiln::Error, never a crash or a
// raw library exception. A working one encodes to ids inside its vocabulary. Both outcomes must
// occur for both formats: edits that every check refuses, or that none notices, would exercise
// only half of what this test is for (seed-fixed, so the counts are the same on every run).
TEST(BadInputTokenizer, MutatedFilesNeverCrash) {
  std::mt19937 rng(99);
  const std::string& json = bloom_json_text();
  const std::string spiece = read_file(fixture_path("t5-tiny/spiece.model"));
  constexpr int kTrials = 300;
  int rejected[2] = {0, 0}, working[2] = {0, 0};  // [0]: tokenizer.json, [1]: spiece.model
  for (int i = 0; i < kTrials; ++i) {
    const int kind = i % 2;
    std::string bytes = kind == 0 ? json : spiece;
    const int edits = std::uniform_int_distribution<int>(1, 8)(rng);
    // spiece.model gets any byte. tokenizer.json mostly gets letters and digits for letters and
    // digits (ids, merges, vocabulary and key names change, the JSON stays JSON: the tokenizer's
    // own checks meet them); every fourth trial JSON's punctuation anywhere (the parser's). Random
    // bytes would almost always break the JSON itself and test only the parser.
    constexpr std::string_view kAlnum = "abcdefghijklmnopqrstuvwxyz0123456789";
    constexpr std::string_view kJsonBytes = "0123456789:,\"{}[]ax- ";
    const bool structural = kind == 0 && i % 8 == 0;
    auto pick = [&](std::string_view from) {
      return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
    };
    for (int e = 0; e < edits; ++e) {
      size_t at = std::uniform_int_distribution<size_t>(0, bytes.size() - 1)(rng);
      if (kind == 1) {
        bytes[at] = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
      } else if (structural) {
        bytes[at] = pick(kJsonBytes);
      } else {
        while (!std::isalnum(static_cast<unsigned char>(bytes[at]))) at = (at + 1) % bytes.size();
        bytes[at] = pick(kAlnum);
      }
    }
    try {
      const auto tokenizer = kind == 0 ? make_bpe_tokenizer(bytes, "mutated.json")
                                       : make_sentencepiece_tokenizer(bytes, "mutated.model");
      const std::vector<int64_t> ids = tokenizer->encode("reverse: suvogi = igovus <s> \xFF");
      for (int64_t id : ids)
        EXPECT_TRUE(id >= 0 && id < tokenizer->vocab_size())
            << "trial " << i << ": id " << id << " outside a vocabulary of "
            << tokenizer->vocab_size();
      tokenizer->decode(ids, false);
      tokenizer->decode(ids, true);
      ++working[kind];
    } catch (const Error&) {
      ++rejected[kind];
    } catch (const std::exception& e) {
      ADD_FAILURE() << "trial " << i << ": " << (kind == 0 ? "tokenizer.json" : "spiece.model")
                    << " mutation escaped as a raw exception: " << e.what();
    }
  }
  std::cout << "[ mutated ] tokenizer.json: " << rejected[0] << " rejected, " << working[0]
            << " working; spiece.model: " << rejected[1] << " rejected, " << working[1]
            << " working\n";
  EXPECT_EQ(rejected[0] + working[0] + rejected[1] + working[1], kTrials)
      << "every trial ends in one of the two outcomes";
  for (int kind : {0, 1}) {
    const char* name = kind == 0 ? "tokenizer.json" : "spiece.model";
    EXPECT_GT(rejected[kind], 0) << name << ": no mutation reached a kiln::Error";
    EXPECT_GT(working[kind], 0) << name << ": no mutation left a working tokenizer";
  }
}

TEST(BadInputTokenizer, CorruptSpieceModel) {
  const std::string spiece = read_file(fixture_path("t5-tiny/spiece.model"));
  EXPECT_THROW(make_sentencepiece_tokenizer("", "bad/spiece.model"), Error);
  EXPECT_THROW(make_sentencepiece_tokenizer("this is not a protobuf", "bad/spiece.model"), Error);
  EXPECT_THROW(
      make_sentencepiece_tokenizer(spiece.substr(0, spiece.size() / 2), "bad/spiece.model"), Error);
  std::string garbage(4096, '\0');
  std::mt19937 rng(7);
  for (char& c : garbage) c = static_cast<char>(rng());
  const std::string message =
      error_message([&] { make_sentencepiece_tokenizer(garbage, "bad/spiece.model"); });
  EXPECT_NE(message.find("bad/spiece.model"), std::string::npos) << message;
}

TEST(BadInputTokenizer, MissingOrEmptyDirectory) {
  EXPECT_THROW(load_tokenizer_dir("/nonexistent/kiln/model"), Error);
  EXPECT_NE(error_message([] {
              load_tokenizer_dir("/nonexistent/kiln/model");
            }).find("/nonexistent/kiln/model"),
            std::string::npos);
  const std::string empty_dir = std::string(KILN_TEST_TMP) + "/tokenizer_empty_dir";
  std::filesystem::create_directories(empty_dir);
  const std::string message = error_message([&] { load_tokenizer_dir(empty_dir); });
  EXPECT_NE(message.find(empty_dir), std::string::npos) << message;
  EXPECT_NE(message.find("spiece.model"), std::string::npos) << message;

  const std::string corrupt_dir = std::string(KILN_TEST_TMP) + "/tokenizer_corrupt_dir";
  std::filesystem::create_directories(corrupt_dir);
  std::ofstream(corrupt_dir + "/spiece.model", std::ios::binary) << "\x0a\xff\xff\xff garbage";
  EXPECT_NE(
      error_message([&] { load_tokenizer_dir(corrupt_dir); }).find(corrupt_dir + "/spiece.model"),
      std::string::npos);
}

TEST(BadInputTokenizer, UnknownKindFromAPlan) {
  EXPECT_THROW(make_tokenizer(static_cast<TokenizerKind>(7), "", "plan"), Error);
}

}  // namespace
}  // namespace kiln
