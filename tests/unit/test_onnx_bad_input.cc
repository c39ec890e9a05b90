// Bad ONNX files: a clear kiln::Error naming the file and what is wrong, never a crash. The
// suite's name contains BadInput, so `make asan` runs it under AddressSanitizer + UBSan.
#include <filesystem>

#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/supported_ops.h"
#include "io/mmap_file.h"
#include "io/onnx/onnx_model.h"
#include "onnx_test_models.h"

namespace kiln {
namespace {

using namespace onnx_test;
const std::string kBloom = std::string(KILN_FIXTURES_DIR) + "/onnx/bloom.onnx";

void read_and_build(const std::string& path) { ImportGraph::build(read_onnx_model(path)); }

TEST(OnnxBadInput, MissingFile) {
  const std::string path = test_dir() + "/missing.onnx";
  expect_error([&] { read_onnx_model(path); }, {path}, ErrorKind::kNotFound);
}

TEST(OnnxBadInput, EmptyFile) {
  const std::string path = test_dir() + "/empty.onnx";
  write_bytes(path, "");
  expect_error([&] { read_onnx_model(path); }, {path, "empty file"});
}

TEST(OnnxBadInput, CorruptBytes) {
  const std::string path = test_dir() + "/corrupt.onnx";
  write_bytes(path, std::string("\xff\xff\xff\xff garbage, not a protobuf \x0a\xff", 32));
  expect_error([&] { read_onnx_model(path); }, {path, "not an ONNX model"});
}

TEST(OnnxBadInput, FlippedBytesInARealModel) {
  const std::shared_ptr<MappedFile> real = MappedFile::open(kBloom);
  std::string bytes(real->data(), real->size());
  const std::string path = test_dir() + "/flipped.onnx";
  // Every 97th byte inverted: whatever parses must still be refused or read without a crash.
  for (size_t i = 0; i < bytes.size(); i += 97) bytes[i] = static_cast<char>(~bytes[i]);
  write_bytes(path, bytes);
  try {
    read_and_build(path);
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(path));
  }
}

TEST(OnnxBadInput, TruncatedFile) {
  const std::shared_ptr<MappedFile> real = MappedFile::open(kBloom);
  const std::string dir = test_dir();
  for (double cut : {0.001, 0.1, 0.5, 0.9, 0.999}) {
    const std::string path = dir + "/truncated_" + std::to_string(cut) + ".onnx";
    write_bytes(path, std::string(real->data(), static_cast<size_t>(real->size() * cut)));
    SCOPED_TRACE(path);
    expect_error([&] { read_and_build(path); }, {path});
  }
}

TEST(OnnxBadInput, UnknownOpset) {
  const std::string dir = test_dir();
  for (int64_t opset : {11, 12, 19, 21}) {
    ::onnx::ModelProto m = tiny_model();
    m.mutable_opset_import(0)->set_version(opset);
    const std::string path = write_model(m, dir + "/opset" + std::to_string(opset) + ".onnx");
    expect_error(
        [&] { read_onnx_model(path); },
        {path, "opset " + std::to_string(opset) + " of the default ONNX domain", "13 to 18"});
  }
}

TEST(OnnxBadInput, NoDefaultDomainOpset) {
  ::onnx::ModelProto m = tiny_model();
  m.mutable_opset_import(0)->set_domain("com.microsoft");
  const std::string path = write_model(m, test_dir() + "/m.onnx");
  expect_error([&] { read_onnx_model(path); }, {path, "no opset of the default ONNX domain"});
}

TEST(OnnxBadInput, NoGraph) {
  ::onnx::ModelProto m = tiny_model();
  m.clear_graph();
  const std::string path = write_model(m, test_dir() + "/m.onnx");
  expect_error([&] { read_onnx_model(path); }, {path, "no graph"});
}

TEST(OnnxBadInput, ExternalDataAbsolutePath) {
  const std::string dir = test_dir();
  write_bytes(dir + "/w.bin", std::string(32, '\0'));
  ::onnx::ModelProto m = tiny_model();
  make_external(m.mutable_graph()->mutable_initializer(0), dir + "/w.bin", 0, 32);
  const std::string path = write_model(m, dir + "/m.onnx");
  expect_error([&] { read_onnx_model(path); }, {path, "initializer 'W'", "absolute path"});
}

TEST(OnnxBadInput, ExternalDataDotDotEscape) {
  const std::string dir = test_dir();
  fs::create_directories(dir + "/model");
  write_bytes(dir + "/secret.bin", std::string(32, '\0'));
  ::onnx::ModelProto m = tiny_model();
  make_external(m.mutable_graph()->mutable_initializer(0), "../secret.bin", 0, 32);
  const std::string path = write_model(m, dir + "/model/m.onnx");
  expect_error([&] { read_onnx_model(path); }, {path, "'../secret.bin'", "outside the model's"});
  // The same escape written after a folder name.
  make_external(m.mutable_graph()->mutable_initializer(0), "sub/../../secret.bin", 0, 32);
  write_model(m, path);
  expect_error([&] { read_onnx_model(path); }, {path, "outside the model's"});
}

TEST(OnnxBadInput, ExternalDataSymlinkEscape) {
  const std::string dir = test_dir();
  fs::create_directories(dir + "/model");
  write_bytes(dir + "/secret.bin", std::string(32, '\0'));
  fs::create_symlink(dir + "/secret.bin", dir + "/model/w.bin");
  ::onnx::ModelProto m = tiny_model();
  make_external(m.mutable_graph()->mutable_initializer(0), "w.bin", 0, 32);
  const std::string path = write_model(m, dir + "/model/m.onnx");
  expect_error([&] { read_onnx_model(path); }, {path, "'w.bin'", "symbolic link"});
}

TEST(OnnxBadInput, ExternalDataMissingFile) {
  const std::string dir = test_dir();
  ::onnx::ModelProto m = tiny_model();
  make_external(m.mutable_graph()->mutable_initializer(0), "nope.bin", 0, 32);
  const std::string path = write_model(m, dir + "/m.onnx");
  expect_error([&] { read_onnx_model(path); }, {path, "nope.bin", "not found"},
               ErrorKind::kNotFound);
}

TEST(OnnxBadInput, ExternalDataOffsetPastEnd) {
  const std::string dir = test_dir();
  write_bytes(dir + "/w.bin", std::string(40, '\0'));
  ::onnx::ModelProto m = tiny_model();
  make_external(m.mutable_graph()->mutable_initializer(0), "w.bin", 100, 32);
  const std::string path = write_model(m, dir + "/m.onnx");
  expect_error([&] { read_onnx_model(path); }, {path, "offset 100 is past the end"});
  // Inside the file, but the tensor's 32 bytes run past its end.
  make_external(m.mutable_graph()->mutable_initializer(0), "w.bin", 16, -1);
  write_model(m, path);
  expect_error([&] { read_onnx_model(path); }, {path, "[16, 48) lies past the end"});
}

TEST(OnnxBadInput, ExternalDataWrongLengthOrBadNumbers) {
  const std::string dir = test_dir();
  write_bytes(dir + "/w.bin", std::string(64, '\0'));
  ::onnx::ModelProto m = tiny_model();
  make_external(m.mutable_graph()->mutable_initializer(0), "w.bin", 0, 16);
  const std::string path = write_model(m, dir + "/m.onnx");
  expect_error([&] { read_onnx_model(path); }, {path, "length 16 does not match"});
  make_external(m.mutable_graph()->mutable_initializer(0), "w.bin", 0, -1);
  m.mutable_graph()->mutable_initializer(0)->mutable_external_data(1)->set_value("-8");
  write_model(m, path);
  expect_error([&] { read_onnx_model(path); }, {path, "offset '-8'"});
}

TEST(OnnxBadInput, InlineDataDoesNotMatchShape) {
  const std::string dir = test_dir();
  ::onnx::ModelProto m = tiny_model();
  m.mutable_graph()->mutable_initializer(0)->mutable_raw_data()->resize(30);
  const std::string path = write_model(m, dir + "/raw.onnx");
  expect_error([&] { read_onnx_model(path); }, {path, "initializer 'W'", "raw_data has 30 bytes"});
  ::onnx::ModelProto typed = tiny_model();
  auto* t = typed.mutable_graph()->mutable_initializer(1);
  t->clear_raw_data();
  t->add_float_data(1.0f);  // B is [2]
  const std::string path2 = write_model(typed, dir + "/typed.onnx");
  expect_error([&] { read_onnx_model(path2); },
               {path2, "initializer 'B'", "1 values in float_data"});
  // A huge claimed shape with a few bytes: refused before anything is allocated.
  ::onnx::ModelProto huge = tiny_model();
  huge.mutable_graph()->mutable_initializer(0)->set_dims(0, int64_t{1} << 40);
  const std::string path3 = write_model(huge, dir + "/huge.onnx");
  expect_error([&] { read_onnx_model(path3); }, {path3, "initializer 'W'"});
  ::onnx::ModelProto negative = tiny_model();
  negative.mutable_graph()->mutable_initializer(0)->set_dims(0, -4);
  const std::string path4 = write_model(negative, dir + "/negative.onnx");
  expect_error([&] { read_onnx_model(path4); }, {path4, "negative dimension"});
}

TEST(OnnxBadInput, GraphWithACycle) {
  ::onnx::ModelProto m = tiny_model();
  auto* g = m.mutable_graph();
  // mm reads loop_out, which needs relu's output, which needs mm's: mm -> relu -> back -> mm.
  g->mutable_node(0)->set_input(0, "loop_out");
  add_node(g, "Relu", "relu", {"XW"}, {"r"});
  add_node(g, "Add", "back", {"r", "X"}, {"loop_out"});
  const std::string path = write_model(m, test_dir() + "/m.onnx");
  expect_error([&] { read_and_build(path); }, {path, "cycle", "'mm'", "'relu'", "'back'"});
}

TEST(OnnxBadInput, UndefinedValueAndTwoProducers) {
  const std::string dir = test_dir();
  ::onnx::ModelProto m = tiny_model();
  m.mutable_graph()->mutable_node(1)->set_input(1, "nowhere");
  const std::string path = write_model(m, dir + "/undefined.onnx");
  expect_error([&] { read_and_build(path); }, {path, "node 'bias'", "'nowhere'"});
  ::onnx::ModelProto twice = tiny_model();
  add_node(twice.mutable_graph(), "Relu", "again", {"X"}, {"XW"});
  const std::string path2 = write_model(twice, dir + "/twice.onnx");
  expect_error([&] { read_and_build(path2); }, {path2, "node 'again'", "'XW'", "node 'mm'"});
  ::onnx::ModelProto no_output = tiny_model();
  no_output.mutable_graph()->mutable_output(0)->set_name("gone");
  const std::string path3 = write_model(no_output, dir + "/output.onnx");
  expect_error([&] { read_and_build(path3); }, {path3, "graph output 'gone'"});
}

TEST(OnnxBadInput, UnsupportedOpsAreListedAtOnce) {
  ::onnx::ModelProto m = tiny_model();
  auto* g = m.mutable_graph();
  add_node(g, "Conv", "conv1", {"Y", "W"}, {"c1"});
  add_node(g, "Conv", "conv2", {"c1", "W"}, {"c2"});
  add_node(g, "LSTM", "rnn", {"c2"}, {"l"});
  add_node(g, "FusedGemm", "custom", {"l"}, {"out2"})->set_domain("com.microsoft");
  const std::string path = write_model(m, test_dir() + "/m.onnx");
  const ImportGraph ig = ImportGraph::build(read_onnx_model(path));
  const std::vector<UnsupportedOp> found = find_unsupported_ops(ig);
  ASSERT_EQ(found.size(), 4u);
  EXPECT_EQ(found[0].node, "conv1");
  EXPECT_EQ(found[3].op, "com.microsoft::FusedGemm");
  expect_error([&] { check_supported_ops(ig); },
               {path, "4 nodes", "Conv (2 nodes): conv1, conv2", "LSTM (1 node): rnn",
                "com.microsoft::FusedGemm (1 node): custom"});
}

TEST(OnnxBadInput, AttributeWithoutItsValue) {
  ::onnx::ModelProto m = tiny_model();
  auto* a = m.mutable_graph()->mutable_node(0)->add_attribute();
  a->set_name("value");
  a->set_type(::onnx::AttributeProto::TENSOR);
  const std::string path = write_model(m, test_dir() + "/m.onnx");
  expect_error([&] { read_onnx_model(path); }, {path, "node 'mm' attribute 'value'"});
}

}  // namespace
}  // namespace kiln
