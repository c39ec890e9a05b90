// safetensors reader/writer, sharded checkpoints and the mmap layer. Expected tensor names,
// shapes and values come from the fixture files' headers and bytes as read by Python's json and
// struct modules, not from this reader.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/status.h"
#include "io/mmap_file.h"
#include "io/safetensors.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kFixtures = KILN_FIXTURES_DIR;
const std::string kT5File = kFixtures + "/t5-tiny/model.safetensors";
const std::string kBloomFile = kFixtures + "/bloom-tiny/model.safetensors";

// A fresh directory per test under KILN_TEST_TMP.
std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(KILN_TEST_TMP) / "io_safetensors" /
                       (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string le_u64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file with the given header text and data bytes, the length field set honestly.
std::string raw_file(const std::string& header, const std::string& data) {
  return le_u64(header.size()) + header + data;
}

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw()), t.nbytes());
}

// Runs `fn`, expecting a kiln::Error whose message contains every piece of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts,
                  ErrorKind kind = ErrorKind::kRuntime) {
  try {
    fn();
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    return;
  }
  ADD_FAILURE() << "expected a kiln::Error";
}

void expect_open_error(const std::string& bytes, const std::vector<std::string>& parts) {
  const std::string path = test_dir() + "/bad.safetensors";
  write_file(path, bytes);
  std::vector<std::string> all = parts;
  all.push_back(path);
  expect_error([&] { SafetensorsFile::open(path); }, all);
}

TEST(MappedFile, MapsWholeFile) {
  const std::string path = test_dir() + "/f.bin";
  write_file(path, std::string("abc\0def", 7));
  auto f = MappedFile::open(path);
  ASSERT_EQ(f->size(), 7u);
  EXPECT_EQ(std::string(f->data(), 7), std::string("abc\0def", 7));
  EXPECT_EQ(f->path(), path);
  EXPECT_EQ(read_text_file(path), std::string("abc\0def", 7));
}

TEST(MappedFile, EmptyFileIsFine) {
  const std::string path = test_dir() + "/empty";
  write_file(path, "");
  auto f = MappedFile::open(path);
  EXPECT_EQ(f->size(), 0u);
  EXPECT_EQ(read_text_file(path), "");
}

TEST(MappedFile, MissingFileIsNotFound) {
  const std::string path = test_dir() + "/nope.bin";
  expect_error([&] { MappedFile::open(path); }, {path}, ErrorKind::kNotFound);
  expect_error([&] { read_text_file(path); }, {path}, ErrorKind::kNotFound);
}

TEST(MappedFile, DirectoryIsAnError) {
  const std::string dir = test_dir();
  expect_error([&] { MappedFile::open(dir); }, {dir, "directory"});
}

TEST(Safetensors, OpensT5FixtureF32) {
  const SafetensorsFile f = SafetensorsFile::open(kT5File);
  EXPECT_EQ(f.path(), kT5File);
  EXPECT_EQ(f.tensors().size(), 98u);
  ASSERT_EQ(f.metadata().count("format"), 1u);
  EXPECT_EQ(f.metadata().at("format"), "pt");

  const Tensor& shared = f.tensors().at("shared.weight");
  EXPECT_EQ(shared.dtype(), DType::kF32);
  EXPECT_EQ(shared.shape(), (Shape{288, 192}));
  EXPECT_FALSE(shared.owns_memory());
  const float* s = shared.data<float>();
  EXPECT_FLOAT_EQ(s[0], -0.16499243676662445f);
  EXPECT_FLOAT_EQ(s[1], -0.15509046614170074f);
  EXPECT_FLOAT_EQ(s[288 * 192 - 1], -1.6766401529312134f);

  const Tensor& bias =
      f.tensors().at("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
  EXPECT_EQ(bias.shape(), (Shape{32, 6}));
  EXPECT_EQ(f.tensors().at("decoder.block.3.layer.2.DenseReluDense.wi_1.weight").shape(),
            (Shape{512, 192}));
  EXPECT_EQ(f.tensors().at("lm_head.weight").shape(), (Shape{288, 192}));
  const Tensor& ln = f.tensors().at("encoder.final_layer_norm.weight");
  EXPECT_EQ(ln.shape(), (Shape{192}));
  EXPECT_FLOAT_EQ(ln.data<float>()[0], 0.971764326095581f);
  EXPECT_FLOAT_EQ(ln.data<float>()[191], 0.9651386141777039f);
  EXPECT_EQ(
      f.tensors().count("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"),
      0u);
}

TEST(Safetensors, OpensBloomFixtureF16) {
  const SafetensorsFile f = SafetensorsFile::open(kBloomFile);
  EXPECT_EQ(f.tensors().size(), 77u);
  const Tensor& emb = f.tensors().at("transformer.word_embeddings.weight");
  EXPECT_EQ(emb.dtype(), DType::kF16);
  EXPECT_EQ(emb.shape(), (Shape{448, 256}));
  const auto* bits = static_cast<const uint16_t*>(emb.raw());
  EXPECT_EQ(bits[0], 0x2452);
  EXPECT_EQ(bits[1], 0xa7df);
  const Tensor emb32 = emb.to_f32();
  EXPECT_EQ(emb32.data<float>()[0], 0.016876220703125f);
  EXPECT_EQ(emb32.data<float>()[1], -0.0307464599609375f);
  EXPECT_EQ(emb32.data<float>()[448 * 256 - 1], -0.01248931884765625f);

  EXPECT_EQ(f.tensors().at("transformer.h.5.self_attention.query_key_value.weight").shape(),
            (Shape{768, 256}));
  EXPECT_EQ(f.tensors().at("transformer.h.0.mlp.dense_4h_to_h.weight").shape(), (Shape{256, 1024}));
  const Tensor ln = f.tensors().at("transformer.ln_f.weight").to_f32();
  EXPECT_EQ(ln.data<float>()[0], 1.2841796875f);
  EXPECT_EQ(ln.data<float>()[255], 1.1845703125f);
}

TEST(Safetensors, ViewsKeepTheMappingAlive) {
  Tensor t;
  {
    const SafetensorsFile f = SafetensorsFile::open(kT5File);
    t = f.tensors().at("shared.weight");
  }
  // The file object is gone; the view still owns the mapping (ASan checks this read).
  EXPECT_FLOAT_EQ(t.data<float>()[288 * 192 - 1], -1.6766401529312134f);
}

TEST(Checkpoint, OpensSingleFileDirs) {
  const Checkpoint t5 = Checkpoint::open_dir(kFixtures + "/t5-tiny");
  EXPECT_EQ(t5.files(), std::vector<std::string>{kT5File});
  EXPECT_EQ(t5.tensors().size(), 98u);
  EXPECT_TRUE(t5.has("shared.weight"));
  EXPECT_FALSE(t5.has("transformer.ln_f.weight"));
  EXPECT_EQ(t5.get("lm_head.weight", {288, 192}).dtype(), DType::kF32);

  const Checkpoint bloom = Checkpoint::open_dir(kFixtures + "/bloom-tiny");
  EXPECT_EQ(bloom.tensors().size(), 77u);
  EXPECT_EQ(bloom.get("transformer.word_embeddings_layernorm.bias", {256}).dtype(), DType::kF16);
}

TEST(Checkpoint, GetErrorsNameCheckpointTensorAndShapes) {
  const std::string dir = kFixtures + "/t5-tiny";
  const Checkpoint ckpt = Checkpoint::open_dir(dir);
  expect_error([&] { ckpt.get("decoder.embed_tokens.weight"); },
               {dir, "decoder.embed_tokens.weight"});
  expect_error(
      [&] {
        ckpt.get("shared.weight", {192, 288});
      },
      {dir, "tensor shared.weight has shape [288, 192], expected [192, 288]"});
}

TEST(Safetensors, WriteThenOpenRoundTrips) {
  const std::string path = test_dir() + "/rt.safetensors";
  std::map<std::string, Tensor> tensors;
  tensors["a_f32"] = Tensor::from_vector<float>({1.5f, -2.f, 3.25f, 0.f, 1e-8f, -7.f}, {2, 3});
  tensors["b_i8"] = Tensor::from_vector<int8_t>({-1, 2, 127}, {3});  // odd size: next is unaligned
  tensors["c_f16"] = Tensor::from_vector<float>({0.5f, -1.f, 65504.f, 1e-3f}, {4}).to(DType::kF16);
  tensors["d_bf16"] = Tensor::from_vector<float>({3.f, -0.125f}, {1, 2}).to(DType::kBF16);
  tensors["e_i32"] = Tensor::from_vector<int32_t>({7, -8, 9, 2147483647}, {2, 2});
  tensors["f_i64"] = Tensor::from_vector<int64_t>({int64_t{1} << 40, -3}, {2});
  tensors["g_scalar"] = Tensor::from_vector<float>({42.f}, {});
  tensors["h_empty"] = Tensor::empty(DType::kF32, {0, 4});
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "x\"y"}};
  write_safetensors(path, tensors, metadata);

  // The layout HF writes: 8-byte aligned data section, valid JSON, data in name order.
  const std::string raw = read_text_file(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(raw[i]);
  EXPECT_EQ(header_len % 8, 0u);
  const auto header = nlohmann::json::parse(raw.substr(8, header_len));
  uint64_t expected_begin = 0;
  for (const auto& [name, t] : tensors) {
    const auto& offsets = header.at(name).at("data_offsets");
    EXPECT_EQ(offsets[0].get<uint64_t>(), expected_begin) << name;
    expected_begin += t.nbytes();
  }
  EXPECT_EQ(raw.size(), 8 + header_len + expected_begin);

  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor& back = f.tensors().at(name);
    EXPECT_EQ(back.dtype(), t.dtype()) << name;
    EXPECT_EQ(back.shape(), t.shape()) << name;
    EXPECT_EQ(bytes_of(back), bytes_of(t)) << name;
  }
  // Tensors after the 3-byte one sit at odd offsets: readable, but copied out of the mapping.
  EXPECT_FALSE(f.tensors().at("a_f32").owns_memory());
  EXPECT_TRUE(f.tensors().at("c_f16").owns_memory());
  EXPECT_EQ(f.tensors().at("e_i32").data<int32_t>()[3], 2147483647);
  EXPECT_EQ(f.tensors().at("g_scalar").data<float>()[0], 42.f);
}

TEST(Safetensors, WriteWithoutMetadataAndOverwrite) {
  const std::string path = test_dir() + "/nometa.safetensors";
  write_safetensors(path, {{"x", Tensor::from_vector<float>({1.f}, {1})}});
  const SafetensorsFile first = SafetensorsFile::open(path);
  EXPECT_TRUE(first.metadata().empty());
  // Overwriting a file that is still mapped leaves the old mapping intact.
  write_safetensors(path, {{"x", Tensor::from_vector<float>({2.f}, {1})}});
  EXPECT_EQ(first.tensors().at("x").data<float>()[0], 1.f);
  EXPECT_EQ(SafetensorsFile::open(path).tensors().at("x").data<float>()[0], 2.f);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// Splits the T5 fixture into two shards plus an index and checks the checkpoint loads the same
// tensors with the same bytes.
TEST(Checkpoint, ShardedIndexLoadsSameTensors) {
  const std::string dir = test_dir();
  const SafetensorsFile whole = SafetensorsFile::open(kT5File);
  std::map<std::string, Tensor> shard1;
  std::map<std::string, Tensor> shard2;
  nlohmann::json weight_map = nlohmann::json::object();
  size_t i = 0;
  for (const auto& [name, t] : whole.tensors()) {
    const bool first = i++ % 2 == 0;  // interleave so both shards hold encoder and decoder
    (first ? shard1 : shard2)[name] = t;
    weight_map[name] =
        first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir + "/model-00001-of-00002.safetensors", shard1, {{"format", "pt"}});
  write_safetensors(dir + "/model-00002-of-00002.safetensors", shard2, {{"format", "pt"}});
  const nlohmann::json index = {{"metadata", {{"total_size", 16975872}}},
                                {"weight_map", weight_map}};
  write_file(dir + "/model.safetensors.index.json", index.dump(2));

  const Checkpoint ckpt = Checkpoint::open_dir(dir);
  EXPECT_EQ(ckpt.dir(), dir);
  EXPECT_EQ(ckpt.files(), (std::vector<std::string>{dir + "/model-00001-of-00002.safetensors",
                                                    dir + "/model-00002-of-00002.safetensors"}));
  ASSERT_EQ(ckpt.tensors().size(), whole.tensors().size());
  for (const auto& [name, t] : whole.tensors()) {
    ASSERT_TRUE(ckpt.has(name)) << name;
    const Tensor& got = ckpt.get(name, t.shape());
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(bytes_of(got), bytes_of(t)) << name;
  }
  EXPECT_FLOAT_EQ(ckpt.get("shared.weight").data<float>()[0], -0.16499243676662445f);
}

TEST(Checkpoint, EachTensorComesFromTheShardTheIndexNames) {
  const std::string dir = test_dir();
  write_safetensors(dir + "/a.safetensors", {{"x", Tensor::from_vector<float>({1.f}, {1})},
                                             {"y", Tensor::from_vector<float>({10.f}, {1})}});
  write_safetensors(dir + "/b.safetensors", {{"x", Tensor::from_vector<float>({2.f}, {1})},
                                             {"y", Tensor::from_vector<float>({20.f}, {1})}});
  write_file(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"x": "b.safetensors", "y": "a.safetensors"}})");
  const Checkpoint ckpt = Checkpoint::open_dir(dir);
  EXPECT_EQ(ckpt.tensors().size(), 2u);
  EXPECT_EQ(ckpt.get("x").data<float>()[0], 2.f);
  EXPECT_EQ(ckpt.get("y").data<float>()[0], 10.f);
}

TEST(BadInputSafetensors, EmptyFile) { expect_open_error("", {"too short"}); }

TEST(BadInputSafetensors, TruncatedHeader) {
  expect_open_error(std::string("\x10\0\0\0\0", 5), {"5 bytes", "too short"});
}

TEST(BadInputSafetensors, HeaderLengthPastEnd) {
  expect_open_error(le_u64(1000) + "{}", {"header length 1000", "past the end"});
}

TEST(BadInputSafetensors, AbsurdHeaderLength) {
  expect_open_error(le_u64(~uint64_t{0}) + "{}", {"absurd"});
}

TEST(BadInputSafetensors, InvalidJsonHeader) {
  expect_open_error(raw_file(R"({"a": {"dtype": "F32",)", ""), {"invalid JSON"});
}

TEST(BadInputSafetensors, HeaderNotAnObject) {
  expect_open_error(raw_file("[1, 2]", ""), {"must be a JSON object"});
}

TEST(BadInputSafetensors, EntryNotAnObject) {
  expect_open_error(raw_file(R"({"w": 5})", ""), {"'w'", "JSON object"});
}

TEST(BadInputSafetensors, UnknownDtype) {
  expect_open_error(
      raw_file(R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", "ab"),
      {"'w'", "F8_E4M3", "F32"});
}

TEST(BadInputSafetensors, MissingOrWrongTypedFields) {
  expect_open_error(raw_file(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", "abcd"),
                    {"'w'", "missing 'dtype'"});
  expect_open_error(
      raw_file(R"({"w": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})", "abcd"),
      {"'w'", "'dtype' must be a string"});
  expect_open_error(raw_file(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", "abcd"),
                    {"'w'", "missing 'shape'"});
  expect_open_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", "abcd"),
      {"'w'", "'shape' must be an array"});
  expect_open_error(raw_file(R"({"w": {"dtype": "F32", "shape": [1]}})", "abcd"),
                    {"'w'", "missing 'data_offsets'"});
  expect_open_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", "abcd"),
      {"'w'", "data_offsets"});
  expect_open_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, "4"]}})", "abcd"),
      {"'w'", "data_offsets"});
}

TEST(BadInputSafetensors, NegativeOrNonIntegerDims) {
  expect_open_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": [-1, 1], "data_offsets": [0, 4]}})", "abcd"),
      {"'w'", "-1"});
  expect_open_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", "abcd"),
      {"'w'", "1.5"});
  expect_open_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": ["1"], "data_offsets": [0, 4]}})", "abcd"),
      {"'w'", "not a non-negative integer"});
}

TEST(BadInputSafetensors, DeeplyNestedHeaderValue) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  expect_open_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": )" + deep + R"(, "data_offsets": [0, 4]}})",
               "abcd"),
      {"'w'", "not a non-negative integer"});
}

TEST(BadInputSafetensors, ShapeByteCountMismatch) {
  expect_open_error(raw_file(R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})",
                             std::string(12, 'x')),
                    {"'w'", "needs 16 bytes", "span 12 bytes"});
}

TEST(BadInputSafetensors, ElementCountOverflow) {
  expect_open_error(
      raw_file(
          R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 0]}})",
          ""),
      {"'w'", "too large"});
  // Refused even when a zero dimension makes the tensor empty: Tensor's stride and element
  // count arithmetic would overflow on the other dimensions.
  expect_open_error(
      raw_file(
          R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 0], "data_offsets": [0, 0]}})",
          ""),
      {"'w'", "too large"});
  expect_open_error(
      raw_file(
          R"({"w": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})",
          ""),
      {"'w'", "too large"});
  // The count fits in 64 bits but the byte count does not.
  expect_open_error(
      raw_file(R"({"w": {"dtype": "I64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})",
               ""),
      {"'w'", "too large"});
}

TEST(BadInputSafetensors, OffsetsPastEnd) {
  expect_open_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", "abcd"),
      {"'w'", "past the end"});
  expect_open_error(
      raw_file(
          R"({"w": {"dtype": "I8", "shape": [0], "data_offsets": [18446744073709551615, 18446744073709551615]}})",
          "abcd"),
      {"'w'", "past the end"});
}

TEST(BadInputSafetensors, BeginAfterEnd) {
  expect_open_error(
      raw_file(R"({"w": {"dtype": "I8", "shape": [2], "data_offsets": [4, 2]}})", "abcd"),
      {"'w'", "begin after end"});
}

TEST(BadInputSafetensors, OverlappingTensors) {
  expect_open_error(raw_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                             std::string(12, 'x')),
                    {"'a'", "'b'", "overlap"});
  // Two names for the same bytes overlap too.
  expect_open_error(raw_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                   "b": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}})",
                             std::string(4, 'x')),
                    {"overlap"});
}

TEST(BadInputSafetensors, BadMetadata) {
  expect_open_error(raw_file(R"({"__metadata__": {"format": 1}})", ""), {"__metadata__", "format"});
  expect_open_error(raw_file(R"({"__metadata__": [1]})", ""), {"__metadata__"});
}

TEST(BadInputSafetensors, TruncatedFixtureNamesTensor) {
  const std::string whole = read_text_file(kBloomFile);
  expect_open_error(whole.substr(0, whole.size() - 100),
                    {"transformer.word_embeddings_layernorm.weight", "past the end"});
}

// Every truncation and a set of single-byte corruptions of a small valid file must either load
// or throw kiln::Error: never another exception type, never a crash (run under ASan).
TEST(BadInputSafetensors, TruncationsAndCorruptionsNeverCrash) {
  const std::string dir = test_dir();
  const std::string good_path = dir + "/good.safetensors";
  write_safetensors(good_path,
                    {{"a", Tensor::from_vector<float>({1.f, 2.f, 3.f}, {3})},
                     {"b", Tensor::from_vector<int64_t>({4, 5}, {1, 2})},
                     {"c", Tensor::from_vector<int8_t>({6}, {1})}},
                    {{"k", "v"}});
  const std::string good = read_text_file(good_path);
  const std::string path = dir + "/mutant.safetensors";
  auto try_open = [&](const std::string& bytes) -> bool {
    write_file(path, bytes);
    try {
      const SafetensorsFile f = SafetensorsFile::open(path);
      for (const auto& [name, t] : f.tensors()) (void)bytes_of(t);
      return true;
    } catch (const Error&) {
      return false;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "non-kiln exception: " << e.what();
      return false;
    }
  };
  for (size_t len = 0; len < good.size(); ++len) {
    EXPECT_FALSE(try_open(good.substr(0, len))) << "truncated to " << len << " bytes loaded";
  }
  const char replacements[] = {'\0', '"', '}', '9'};
  const size_t header_end = 8 + static_cast<uint8_t>(good[0]) + 256 * static_cast<uint8_t>(good[1]);
  for (size_t pos = 0; pos < header_end; ++pos) {
    for (char r : replacements) {
      std::string mutant = good;
      mutant[pos] = r;
      try_open(mutant);
    }
  }
}

TEST(BadInputCheckpoint, NeitherFileNamesDir) {
  const std::string dir = test_dir();
  expect_error([&] { Checkpoint::open_dir(dir); }, {dir, "model.safetensors"},
               ErrorKind::kNotFound);
  expect_error([&] { Checkpoint::open_dir(dir + "/missing"); }, {dir + "/missing"},
               ErrorKind::kNotFound);
}

TEST(BadInputCheckpoint, MissingShard) {
  const std::string dir = test_dir();
  write_safetensors(dir + "/a.safetensors", {{"x", Tensor::from_vector<float>({1.f}, {1})}});
  write_file(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"x": "a.safetensors", "y": "gone.safetensors"}})");
  expect_error([&] { Checkpoint::open_dir(dir); }, {"gone.safetensors", "'y'"},
               ErrorKind::kNotFound);
}

TEST(BadInputCheckpoint, TensorMissingFromItsShard) {
  const std::string dir = test_dir();
  write_safetensors(dir + "/a.safetensors", {{"x", Tensor::from_vector<float>({1.f}, {1})}});
  write_safetensors(dir + "/b.safetensors", {{"y", Tensor::from_vector<float>({1.f}, {1})}});
  // y exists, but not in the shard the index names.
  write_file(dir + "/model.safetensors.index.json",
             R"({"weight_map": {"x": "a.safetensors", "y": "a.safetensors"}})");
  expect_error([&] { Checkpoint::open_dir(dir); }, {"'y'", "a.safetensors", "index.json"});
}

TEST(BadInputCheckpoint, MalformedIndex) {
  const std::string dir = test_dir();
  const std::string index = dir + "/model.safetensors.index.json";
  write_file(index, "{\"weight_map\": ");
  expect_error([&] { Checkpoint::open_dir(dir); }, {index, "invalid JSON"});
  write_file(index, R"({"metadata": {}})");
  expect_error([&] { Checkpoint::open_dir(dir); }, {index, "weight_map"});
  write_file(index, R"({"weight_map": {}})");
  expect_error([&] { Checkpoint::open_dir(dir); }, {index, "no tensors"});
  write_file(index, R"({"weight_map": {"x": 3}})");
  expect_error([&] { Checkpoint::open_dir(dir); }, {index, "'x'"});
  write_file(index, R"({"weight_map": {"x": "../escape.safetensors"}})");
  expect_error([&] { Checkpoint::open_dir(dir); }, {index, "../escape.safetensors"});
}

TEST(BadInputCheckpoint, CorruptShardNamesTheShard) {
  const std::string dir = test_dir();
  write_file(dir + "/a.safetensors", "garbage");
  write_file(dir + "/model.safetensors.index.json", R"({"weight_map": {"x": "a.safetensors"}})");
  expect_error([&] { Checkpoint::open_dir(dir); }, {dir + "/a.safetensors"});
}

TEST(BadInputSafetensors, WriteRejectsReservedName) {
  const std::string path = test_dir() + "/w.safetensors";
  expect_error(
      [&] {
        write_safetensors(path, {{"__metadata__", Tensor::from_vector<float>({1.f}, {1})}});
      },
      {"__metadata__"});
  expect_error([&] { write_safetensors(path, {{"u", Tensor()}}); }, {"'u'", "undefined"});
  expect_error(
      [&] {
        write_safetensors(path, {{"bad\xff", Tensor::from_vector<float>({1.f}, {1})}});
      },
      {"UTF-8"});
}

}  // namespace
}  // namespace kiln
