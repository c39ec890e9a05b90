// Small ONNX models written with the protobuf API for the ONNX reader's tests: the expectations
// of those tests come from what the test itself put into the protobuf.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "onnx.pb.h"

namespace kiln::onnx_test {

namespace fs = std::filesystem;

// A fresh directory per test under KILN_TEST_TMP.
inline std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(KILN_TEST_TMP) / "onnx" /
                       (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string write_model(const ::onnx::ModelProto& model, const std::string& path) {
  std::string bytes;
  EXPECT_TRUE(model.SerializeToString(&bytes));
  write_bytes(path, bytes);
  return path;
}

// dims: a number, or a name for a symbolic dimension ("" for an unknown one).
struct Dim {
  int64_t value = -1;
  std::string param;
  Dim(int64_t v) : value(v) {}      // NOLINT: implicit, for {2, "batch"} lists
  Dim(const char* p) : param(p) {}  // NOLINT
};

inline void set_value_info(::onnx::ValueInfoProto* info, const std::string& name, int elem_type,
                           const std::vector<Dim>& dims) {
  info->set_name(name);
  auto* tensor = info->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(elem_type);
  auto* shape = tensor->mutable_shape();
  for (const Dim& d : dims) {
    auto* dim = shape->add_dim();
    if (d.value >= 0)
      dim->set_dim_value(d.value);
    else if (!d.param.empty())
      dim->set_dim_param(d.param);
  }
}

inline ::onnx::NodeProto* add_node(::onnx::GraphProto* g, const std::string& op,
                                   const std::string& name, const std::vector<std::string>& inputs,
                                   const std::vector<std::string>& outputs) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (const auto& i : inputs) n->add_input(i);
  for (const auto& o : outputs) n->add_output(o);
  return n;
}

// A float initializer of `dims` with `values` in raw_data.
inline ::onnx::TensorProto* add_raw_float(::onnx::GraphProto* g, const std::string& name,
                                          const std::vector<int64_t>& dims,
                                          const std::vector<float>& values) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(::onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t->add_dims(d);
  t->set_raw_data(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  return t;
}

// Y = MatMul(X, W) + B: X float [batch, 4] (batch symbolic), W [4, 2] and B [2] inline, opset 17.
inline ::onnx::ModelProto tiny_model() {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("kiln-test");
  m.set_producer_version("1");
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("tiny");
  set_value_info(g->add_input(), "X", ::onnx::TensorProto::FLOAT, {"batch", 4});
  set_value_info(g->add_output(), "Y", ::onnx::TensorProto::FLOAT, {"batch", 2});
  add_raw_float(g, "W", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  add_raw_float(g, "B", {2}, {0.5f, -0.5f});
  add_node(g, "MatMul", "mm", {"X", "W"}, {"XW"});
  add_node(g, "Add", "bias", {"XW", "B"}, {"Y"});
  return m;
}

// Points `t` at `location` in external data, dropping its inline bytes.
inline void make_external(::onnx::TensorProto* t, const std::string& location, int64_t offset,
                          int64_t length) {
  t->clear_raw_data();
  t->set_data_location(::onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* key, const std::string& value) {
    auto* kv = t->add_external_data();
    kv->set_key(key);
    kv->set_value(value);
  };
  add("location", location);
  if (offset >= 0) add("offset", std::to_string(offset));
  if (length >= 0) add("length", std::to_string(length));
}

// Runs `fn`, expecting a kiln::Error whose message contains every piece of `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts,
                         ErrorKind kind = ErrorKind::kRuntime) {
  try {
    fn();
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_THAT(e.what(), ::testing::HasSubstr(p));
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    return;
  }
  ADD_FAILURE() << "expected a kiln::Error containing " << ::testing::PrintToString(parts);
}

}  // namespace kiln::onnx_test
