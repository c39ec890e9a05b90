// Runs one ONNX op through the import graph's interpreter for the per-op tests: a one-node
// graph, built as plain OnnxModel values (no protobuf), run twice — with the inputs fed at run
// time, and with them as initializers so that the node is folded at build time — and both
// results must agree. Expected values in the tests are derived by hand from ONNX's operator
// specification, never from this interpreter.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/half.h"
#include "frontend/onnx/fold_import_graph.h"
#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/run_import_graph.h"

namespace kiln::onnx_test {

inline ImportTensor f32(Shape shape, const std::vector<float>& v) {
  return ImportTensor::from_vector(OnnxElemType::kFloat, std::move(shape), v);
}
inline ImportTensor i64(Shape shape, const std::vector<int64_t>& v) {
  return ImportTensor::from_vector(OnnxElemType::kInt64, std::move(shape), v);
}
inline ImportTensor i32(Shape shape, const std::vector<int32_t>& v) {
  return ImportTensor::from_vector(OnnxElemType::kInt32, std::move(shape), v);
}
inline ImportTensor boolean(Shape shape, const std::vector<uint8_t>& v) {
  return ImportTensor::from_vector(OnnxElemType::kBool, std::move(shape), v);
}
inline ImportTensor f16(Shape shape, const std::vector<float>& v) {
  std::vector<uint16_t> bits;
  for (float x : v) bits.push_back(float_to_fp16(x));
  return ImportTensor::from_vector(OnnxElemType::kFloat16, std::move(shape), bits);
}
// An omitted optional input.
inline ImportTensor omitted() { return ImportTensor(); }

inline OnnxAttribute attr_int(const std::string& name, int64_t v) {
  OnnxAttribute a;
  a.name = name;
  a.kind = OnnxAttrKind::kInt;
  a.i = v;
  return a;
}
inline OnnxAttribute attr_float(const std::string& name, float v) {
  OnnxAttribute a;
  a.name = name;
  a.kind = OnnxAttrKind::kFloat;
  a.f = v;
  return a;
}
inline OnnxAttribute attr_ints(const std::string& name, std::vector<int64_t> v) {
  OnnxAttribute a;
  a.name = name;
  a.kind = OnnxAttrKind::kInts;
  a.ints = std::move(v);
  return a;
}
inline OnnxTensor onnx_tensor(const std::string& name, const ImportTensor& t) {
  OnnxTensor o;
  o.name = name;
  o.type = t.type();
  o.dims = t.shape();
  o.data = t.to_kiln();
  o.bytes = static_cast<size_t>(t.numel()) * t.element_bytes();
  return o;
}
inline OnnxAttribute attr_tensor(const std::string& name, const ImportTensor& t) {
  OnnxAttribute a;
  a.name = name;
  a.kind = OnnxAttrKind::kTensor;
  a.tensors.push_back(onnx_tensor(name, t));
  return a;
}

struct OpCase {
  std::string op;
  std::vector<ImportTensor> inputs;  // omitted() for an optional input left out
  std::vector<OnnxAttribute> attrs;
  int outputs = 1;
  int64_t opset = 17;
};

enum class Feed { kRunTime, kInitializers };

// The one-node model of `c`: inputs x0, x1, ... (graph inputs with their static shapes, or
// initializers), outputs y0, y1, ...
inline OnnxModel op_model(const OpCase& c, Feed feed) {
  OnnxModel m;
  m.path = "op_test.onnx";
  m.ir_version = 8;
  m.opset = c.opset;
  OnnxNode node;
  node.name = c.op + "_node";
  node.op_type = c.op;
  node.attributes = c.attrs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const ImportTensor& t = c.inputs[i];
    if (!t.has_shape()) {
      node.inputs.push_back("");
      continue;
    }
    const std::string name = "x" + std::to_string(i);
    node.inputs.push_back(name);
    if (feed == Feed::kInitializers) {
      m.graph.initializers.push_back(onnx_tensor(name, t));
    } else {
      OnnxValueInfo info;
      info.name = name;
      info.type = t.type();
      std::vector<OnnxDim> dims;
      for (int64_t d : t.shape()) dims.push_back(OnnxDim{d, ""});
      info.shape = dims;
      m.graph.inputs.push_back(info);
    }
  }
  for (int i = 0; i < c.outputs; ++i) {
    node.outputs.push_back("y" + std::to_string(i));
    OnnxValueInfo info;
    info.name = "y" + std::to_string(i);
    m.graph.outputs.push_back(info);
  }
  m.graph.nodes.push_back(node);
  return m;
}

inline std::map<std::string, ImportTensor> run_fed(const OpCase& c, Feed feed) {
  const ImportGraph g = ImportGraph::build(op_model(c, feed));
  std::map<std::string, ImportTensor> inputs;
  if (feed == Feed::kRunTime)
    for (size_t i = 0; i < c.inputs.size(); ++i)
      if (c.inputs[i].has_shape()) inputs["x" + std::to_string(i)] = c.inputs[i];
  ImportRunStats stats;
  auto out = run_import_graph(g, inputs, &stats);
  if (feed == Feed::kInitializers) {
    EXPECT_EQ(stats.folded_nodes, 1) << c.op << " folds";
  }
  return out;
}

// Values of any numeric tensor as doubles (bool 0/1).
inline std::vector<double> values_of(const ImportTensor& t) {
  std::vector<double> v;
  if (is_float_type(t.type())) {
    for (float x : t.to_floats()) v.push_back(x);
  } else {
    for (int64_t x : t.to_int64s()) v.push_back(static_cast<double>(x));
  }
  return v;
}

// Runs `c` both ways; the results must be identical. Output i is "y<i>".
inline std::vector<ImportTensor> run_op(const OpCase& c) {
  const auto at_run = run_fed(c, Feed::kRunTime);
  const auto folded = run_fed(c, Feed::kInitializers);
  std::vector<ImportTensor> outs;
  for (int i = 0; i < c.outputs; ++i) {
    const std::string name = "y" + std::to_string(i);
    const ImportTensor& a = at_run.at(name);
    const ImportTensor& b = folded.at(name);
    EXPECT_EQ(a.type(), b.type()) << c.op << " " << name;
    EXPECT_EQ(a.shape(), b.shape()) << c.op << " " << name;
    if (a.shape() == b.shape() && a.type() == b.type()) {
      const std::vector<double> va = values_of(a), vb = values_of(b);
      for (size_t k = 0; k < va.size(); ++k)
        EXPECT_TRUE(va[k] == vb[k] || (std::isnan(va[k]) && std::isnan(vb[k])))
            << c.op << " " << name << "[" << k << "]: run time " << va[k] << ", folded " << vb[k];
    }
    outs.push_back(a);
  }
  return outs;
}

inline ImportTensor run_op1(const OpCase& c) { return run_op(c).at(0); }

// Type, shape and values (floats within `tol`, others exactly).
inline void expect_tensor(const ImportTensor& got, OnnxElemType type, const Shape& shape,
                          const std::vector<double>& want, double tol = 1e-6) {
  ASSERT_EQ(got.type(), type) << onnx_elem_type_name(got.type());
  ASSERT_EQ(got.shape(), shape) << shape_str(got.shape());
  const std::vector<double> v = values_of(got);
  ASSERT_EQ(v.size(), want.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(v[i])) << "element " << i << ": " << v[i];
    } else if (is_float_type(type)) {
      EXPECT_NEAR(v[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << "element " << i;
    } else {
      EXPECT_EQ(v[i], want[i]) << "element " << i;
    }
  }
}

// Runs `c` with run-time inputs expecting a kiln::Error that contains every part.
inline void expect_op_error(const OpCase& c, const std::vector<std::string>& parts) {
  for (Feed feed : {Feed::kRunTime, Feed::kInitializers}) {
    try {
      run_fed(c, feed);
      ADD_FAILURE() << c.op << ": expected an error containing " << ::testing::PrintToString(parts);
    } catch (const Error& e) {
      for (const std::string& p : parts) EXPECT_THAT(e.what(), ::testing::HasSubstr(p));
    }
  }
}

}  // namespace kiln::onnx_test
