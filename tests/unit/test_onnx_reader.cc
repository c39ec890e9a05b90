// The ONNX reader and import graph on the fixture exports and on small models this file writes.
// Fixture expectations come from ../shared/fixtures (README: TorchScript exporter, opset 17,
// dynamic batch/sequence axes; reference.safetensors: the input and output names, dtypes and
// shapes onnxruntime ran) and from issue 41's op list, not from this reader.
#include <cstring>
#include <set>

#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/supported_ops.h"
#include "io/onnx/onnx_model.h"
#include "io/safetensors.h"
#include "onnx_test_models.h"

namespace kiln {
namespace {

using namespace onnx_test;
const std::string kOnnxDir = std::string(KILN_FIXTURES_DIR) + "/onnx";

struct Expected {
  std::map<std::string, Tensor> inputs, outputs;  // by name, from reference.safetensors
};

Expected reference_io(const std::string& model) {
  const SafetensorsFile ref = SafetensorsFile::open(kOnnxDir + "/reference.safetensors");
  Expected e;
  for (const auto& [name, t] : ref.tensors()) {
    if (name.rfind(model + ".in.", 0) == 0) e.inputs[name.substr(model.size() + 4)] = t;
    if (name.rfind(model + ".out.", 0) == 0) e.outputs[name.substr(model.size() + 5)] = t;
  }
  return e;
}

void expect_values_match(const ImportGraph& g, const std::vector<int>& ids,
                         const std::map<std::string, Tensor>& ref, const std::string& what) {
  std::set<std::string> names;
  for (int id : ids) {
    const ImportValue& v = g.values()[id];
    names.insert(v.name);
    const auto it = ref.find(v.name);
    if (it == ref.end()) continue;
    DType dtype;
    ASSERT_TRUE(onnx_elem_type_to_dtype(v.type, &dtype)) << what << " " << v.name;
    EXPECT_EQ(dtype, it->second.dtype()) << what << " " << v.name;
    ASSERT_TRUE(v.shape.has_value()) << what << " " << v.name;
    ASSERT_EQ(static_cast<int>(v.shape->size()), it->second.rank()) << what << " " << v.name;
    // Dynamic batch and sequence axes: the first two dimensions are symbolic; the others, where
    // static, are the sizes onnxruntime ran with.
    for (int d = 0; d < it->second.rank(); ++d) {
      const OnnxDim& dim = (*v.shape)[d];
      if (d < 2) {
        EXPECT_FALSE(dim.is_static()) << what << " " << v.name << " dim " << d;
      } else if (dim.is_static()) {
        EXPECT_EQ(dim.value, it->second.dim(d)) << what << " " << v.name << " dim " << d;
      }
    }
  }
  std::set<std::string> want;
  for (const auto& [name, t] : ref) want.insert(name);
  EXPECT_EQ(names, want) << what;
}

class OnnxFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(OnnxFixture, InputsOutputsAndOpsetMatchTheReference) {
  const OnnxModel model = read_onnx_model(kOnnxDir + "/" + GetParam() + ".onnx");
  EXPECT_EQ(model.opset, 17);
  EXPECT_EQ(model.producer_name, "pytorch");  // torch.onnx.export's name for itself
  const ImportGraph g = ImportGraph::build(model);
  const Expected ref = reference_io(GetParam());
  ASSERT_FALSE(ref.inputs.empty());
  expect_values_match(g, g.inputs(), ref.inputs, "input");
  expect_values_match(g, g.outputs(), ref.outputs, "output");
  EXPECT_EQ(g.order().size(), g.nodes().size());
}

TEST_P(OnnxFixture, EveryOpIsInTheImportList) {
  const ImportGraph g = ImportGraph::build(read_onnx_model(kOnnxDir + "/" + GetParam() + ".onnx"));
  std::string unsupported;
  for (const UnsupportedOp& u : find_unsupported_ops(g)) unsupported += u.op + " " + u.node + "; ";
  EXPECT_EQ(unsupported, "");
  EXPECT_NO_THROW(check_supported_ops(g));
  std::set<std::string> ops;
  for (const ImportNode& n : g.nodes()) ops.insert(n.op_type);
  // Issue 41: T5's relative-position bias comes from Range/Log/Min/Where, BLOOM's ALiBi
  // positions from CumSum of the mask; both have MatMul and Softmax attention.
  const std::vector<std::string> expected =
      GetParam() == "bloom" ? std::vector<std::string>{"CumSum", "MatMul", "Softmax"}
                            : std::vector<std::string>{"Log", "Min", "Where", "MatMul", "Softmax"};
  for (const std::string& op : expected)
    EXPECT_TRUE(ops.count(op)) << GetParam() << " has no " << op;
}

TEST_P(OnnxFixture, InitializersHaveTheirData) {
  const ImportGraph g = ImportGraph::build(read_onnx_model(kOnnxDir + "/" + GetParam() + ".onnx"));
  int64_t count = 0;
  for (const ImportValue& v : g.values()) {
    if (v.kind != ImportValueKind::kInitializer) continue;
    ++count;
    ASSERT_TRUE(v.initializer.data.defined()) << v.name;
    EXPECT_EQ(v.initializer.data.shape(), v.initializer.dims) << v.name;
    EXPECT_EQ(v.initializer.data.nbytes(), v.initializer.bytes) << v.name;
  }
  EXPECT_GT(count, 0);
}

INSTANTIATE_TEST_SUITE_P(Onnx, OnnxFixture, ::testing::Values("bloom", "t5_encoder", "t5_decoder"));

TEST(OnnxReader, TinyModelRoundTrips) {
  const std::string path = write_model(tiny_model(), test_dir() + "/tiny.onnx");
  const OnnxModel m = read_onnx_model(path);
  EXPECT_EQ(m.ir_version, 8);
  EXPECT_EQ(m.opset, 17);
  EXPECT_EQ(m.producer_name, "kiln-test");
  ASSERT_EQ(m.graph.inputs.size(), 1u);
  ASSERT_TRUE(m.graph.inputs[0].shape.has_value());
  EXPECT_EQ(onnx_shape_str(*m.graph.inputs[0].shape), "[batch, 4]");
  const ImportGraph g = ImportGraph::build(m);
  ASSERT_EQ(g.inputs().size(), 1u);
  EXPECT_EQ(g.values()[g.inputs()[0]].name, "X");
  ASSERT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(g.values()[g.outputs()[0]].producer, 1);
  const ImportValue& w = g.values()[g.find_value("W")];
  EXPECT_EQ(w.kind, ImportValueKind::kInitializer);
  ASSERT_EQ(w.initializer.data.dtype(), DType::kF32);
  EXPECT_EQ(w.initializer.data.shape(), (Shape{4, 2}));
  EXPECT_EQ(w.initializer.data.data<float>()[7], 8.0f);
}

TEST(OnnxReader, TypedFieldInitializers) {
  ::onnx::ModelProto m = tiny_model();
  auto* g = m.mutable_graph();
  auto add = [&](const char* name, int type, std::vector<int64_t> dims) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    for (int64_t d : dims) t->add_dims(d);
    return t;
  };
  auto* f = add("f", ::onnx::TensorProto::FLOAT, {2});
  f->add_float_data(1.5f);
  f->add_float_data(-2.0f);
  auto* i64 = add("i64", ::onnx::TensorProto::INT64, {});  // a scalar
  i64->add_int64_data(-7);
  auto* i32 = add("i32", ::onnx::TensorProto::INT32, {3});
  for (int v : {1, -2, 3}) i32->add_int32_data(v);
  auto* b = add("b", ::onnx::TensorProto::BOOL, {2});
  b->add_int32_data(1);
  b->add_int32_data(0);
  auto* h = add("h", ::onnx::TensorProto::FLOAT16, {1});
  h->add_int32_data(0x3c00);  // 1.0 in IEEE half
  auto* d = add("d", ::onnx::TensorProto::DOUBLE, {2});
  d->add_double_data(1.0);
  d->add_double_data(2.0);
  auto* empty = add("empty", ::onnx::TensorProto::INT64, {0});
  (void)empty;
  const ImportGraph ig =
      ImportGraph::build(read_onnx_model(write_model(m, test_dir() + "/t.onnx")));
  auto init = [&](const char* name) -> const OnnxTensor& {
    const int v = ig.find_value(name);
    EXPECT_GE(v, 0) << name;
    return ig.values()[v].initializer;
  };
  EXPECT_EQ(init("f").data.data<float>()[1], -2.0f);
  EXPECT_EQ(init("i64").data.rank(), 0);
  EXPECT_EQ(init("i64").data.data<int64_t>()[0], -7);
  EXPECT_EQ(init("i32").data.data<int32_t>()[1], -2);
  EXPECT_EQ(init("b").type, OnnxElemType::kBool);
  EXPECT_EQ(init("b").data.data<int8_t>()[0], 1);
  EXPECT_EQ(init("b").data.data<int8_t>()[1], 0);
  EXPECT_EQ(init("h").data.dtype(), DType::kF16);
  EXPECT_EQ(init("h").data.to_f32().data<float>()[0], 1.0f);
  EXPECT_FALSE(init("d").data.defined());  // kiln has no f64: kept by type and size only
  EXPECT_EQ(init("d").bytes, 16u);
  EXPECT_EQ(init("empty").data.numel(), 0);
}

TEST(OnnxReader, ExternalDataIsReadFromTheModelFolder) {
  const std::string dir = test_dir();
  fs::create_directories(dir + "/weights");
  // 12 bytes of padding, then W's 8 floats (aligned: viewed in place), then B's 2 floats at an
  // odd offset (copied).
  const std::vector<float> w = {1, 2, 3, 4, 5, 6, 7, 8}, b = {0.25f, -4};
  std::string bytes(12, 'x');
  bytes.append(reinterpret_cast<const char*>(w.data()), 32);
  bytes.append(1, 'y');
  bytes.append(reinterpret_cast<const char*>(b.data()), 8);
  write_bytes(dir + "/weights/data.bin", bytes);
  ::onnx::ModelProto m = tiny_model();
  make_external(m.mutable_graph()->mutable_initializer(0), "weights/data.bin", 12, 32);
  make_external(m.mutable_graph()->mutable_initializer(1), "weights/../weights/data.bin", 45, -1);
  const ImportGraph g = ImportGraph::build(read_onnx_model(write_model(m, dir + "/m.onnx")));
  const OnnxTensor& wt = g.values()[g.find_value("W")].initializer;
  EXPECT_EQ(wt.external_location, "weights/data.bin");
  EXPECT_TRUE(wt.data.file_backed());
  EXPECT_EQ(wt.data.data<float>()[5], 6.0f);
  const OnnxTensor& bt = g.values()[g.find_value("B")].initializer;
  EXPECT_EQ(bt.data.data<float>()[0], 0.25f);
  EXPECT_EQ(bt.data.data<float>()[1], -4.0f);
}

TEST(OnnxReader, SymbolicAndUnknownDimsAreKept) {
  ::onnx::ModelProto m = tiny_model();
  auto* g = m.mutable_graph();
  g->mutable_input(0)->Clear();
  set_value_info(g->mutable_input(0), "X", ::onnx::TensorProto::FLOAT, {"batch", ""});
  g->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  const ImportGraph ig =
      ImportGraph::build(read_onnx_model(write_model(m, test_dir() + "/m.onnx")));
  const ImportValue& x = ig.values()[ig.inputs()[0]];
  ASSERT_TRUE(x.shape.has_value());
  EXPECT_EQ((*x.shape)[0].param, "batch");
  EXPECT_FALSE((*x.shape)[1].is_static());
  EXPECT_EQ(onnx_shape_str(*x.shape), "[batch, ?]");
  EXPECT_FALSE(ig.values()[ig.outputs()[0]].shape.has_value());
}

TEST(OnnxReader, AttributesOfEveryKind) {
  ::onnx::ModelProto m = tiny_model();
  auto* node = m.mutable_graph()->mutable_node(0);
  auto attr = [&](const char* name, ::onnx::AttributeProto::AttributeType type) {
    auto* a = node->add_attribute();
    a->set_name(name);
    a->set_type(type);
    return a;
  };
  attr("f", ::onnx::AttributeProto::FLOAT)->set_f(0.5f);
  attr("i", ::onnx::AttributeProto::INT)->set_i(-3);
  attr("s", ::onnx::AttributeProto::STRING)->set_s("tanh");
  auto* t = attr("t", ::onnx::AttributeProto::TENSOR)->mutable_t();
  t->set_data_type(::onnx::TensorProto::INT64);
  t->add_dims(2);
  t->add_int64_data(4);
  t->add_int64_data(5);
  auto* fs_ = attr("fs", ::onnx::AttributeProto::FLOATS);
  fs_->add_floats(1);
  fs_->add_floats(2);
  auto* is = attr("is", ::onnx::AttributeProto::INTS);
  is->add_ints(0);
  is->add_ints(-1);
  attr("ss", ::onnx::AttributeProto::STRINGS)->add_strings("a");
  auto* sub = attr("g", ::onnx::AttributeProto::GRAPH)->mutable_g();
  sub->set_name("body");
  add_node(sub, "Identity", "inner", {"X"}, {"Z"});
  const OnnxModel om = read_onnx_model(write_model(m, test_dir() + "/m.onnx"));
  const OnnxNode& n = om.graph.nodes[0];
  ASSERT_EQ(n.attributes.size(), 8u);
  EXPECT_EQ(n.find_attribute("f")->f, 0.5f);
  EXPECT_EQ(n.find_attribute("i")->i, -3);
  EXPECT_EQ(n.find_attribute("s")->s, "tanh");
  ASSERT_EQ(n.find_attribute("t")->tensors.size(), 1u);
  EXPECT_EQ(n.find_attribute("t")->tensors[0].data.data<int64_t>()[1], 5);
  EXPECT_EQ(n.find_attribute("fs")->floats, (std::vector<float>{1, 2}));
  EXPECT_EQ(n.find_attribute("is")->ints, (std::vector<int64_t>{0, -1}));
  EXPECT_EQ(n.find_attribute("ss")->strings, (std::vector<std::string>{"a"}));
  ASSERT_EQ(n.find_attribute("g")->graphs.size(), 1u);
  EXPECT_EQ(n.find_attribute("g")->graphs[0]->nodes[0].op_type, "Identity");
  EXPECT_EQ(n.find_attribute("g")->kind, OnnxAttrKind::kGraph);
  EXPECT_EQ(n.find_attribute("missing"), nullptr);
}

TEST(OnnxImportGraph, OrdersNodesProducersFirst) {
  ::onnx::ModelProto m = tiny_model();
  auto* nodes = m.mutable_graph()->mutable_node();
  nodes->SwapElements(0, 1);  // the Add is written before the MatMul it reads
  const ImportGraph g = ImportGraph::build(read_onnx_model(write_model(m, test_dir() + "/m.onnx")));
  ASSERT_EQ(g.order().size(), 2u);
  EXPECT_EQ(g.nodes()[g.order()[0]].name, "mm");
  EXPECT_EQ(g.nodes()[g.order()[1]].name, "bias");
}

TEST(OnnxImportGraph, InitializerListedAsInputIsNotARuntimeInput) {
  ::onnx::ModelProto m = tiny_model();
  set_value_info(m.mutable_graph()->add_input(), "W", ::onnx::TensorProto::FLOAT, {4, 2});
  const ImportGraph g = ImportGraph::build(read_onnx_model(write_model(m, test_dir() + "/m.onnx")));
  ASSERT_EQ(g.inputs().size(), 1u);
  EXPECT_EQ(g.values()[g.inputs()[0]].name, "X");
}

TEST(OnnxImportGraph, UnnamedNodesAndOptionalInputs) {
  ::onnx::ModelProto m = tiny_model();
  auto* g = m.mutable_graph();
  g->mutable_node(1)->clear_name();
  g->mutable_output(0)->set_name("Z");
  add_node(g, "Clip", "", {"Y", "", ""}, {"Z"})->clear_name();
  const ImportGraph ig =
      ImportGraph::build(read_onnx_model(write_model(m, test_dir() + "/m.onnx")));
  EXPECT_EQ(ig.nodes()[1].name, "Add#1");
  EXPECT_EQ(ig.nodes()[2].inputs, (std::vector<int>{ig.find_value("Y"), -1, -1}));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(OnnxSupportedOps, IssueListIsImported) {
  // Issue 41, part 1: the ops the torch exporters use for these families, at least.
  const std::vector<std::string_view> issue = {"Abs",
                                               "Add",
                                               "And",
                                               "Cast",
                                               "Concat",
                                               "Constant",
                                               "ConstantOfShape",
                                               "CumSum",
                                               "Div",
                                               "Equal",
                                               "Erf",
                                               "Expand",
                                               "Flatten",
                                               "Gather",
                                               "GatherND",
                                               "Gemm",
                                               "Greater",
                                               "GreaterOrEqual",
                                               "LayerNormalization",
                                               "Less",
                                               "LessOrEqual",
                                               "Log",
                                               "MatMul",
                                               "Max",
                                               "Min",
                                               "Mul",
                                               "Neg",
                                               "Not",
                                               "Pow",
                                               "Range",
                                               "ReduceMean",
                                               "Relu",
                                               "Reshape",
                                               "Shape",
                                               "Slice",
                                               "Softmax",
                                               "Split",
                                               "Sqrt",
                                               "Squeeze",
                                               "Sub",
                                               "Tanh",
                                               "Transpose",
                                               "Trilu",
                                               "Unsqueeze",
                                               "Where"};
  ImportNode node;
  for (std::string_view op : issue) {
    node.op_type = op;
    EXPECT_TRUE(is_supported_onnx_op(node)) << op;
  }
  node.op_type = "Conv";
  EXPECT_FALSE(is_supported_onnx_op(node));
  node.op_type = "MatMul";
  node.domain = "com.microsoft";  // another domain's op of the same name
  EXPECT_FALSE(is_supported_onnx_op(node));
}

}  // namespace
}  // namespace kiln
