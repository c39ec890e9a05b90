// read_onnx_model: the ModelProto of an .onnx file into io/onnx/onnx_model.h's plain values.
#include <climits>
#include <filesystem>

#include "io/mmap_file.h"
#include "io/onnx/onnx_model.h"
#include "io/onnx/onnx_tensor_decode.h"

namespace kiln {
namespace {

using onnx_detail::decode_onnx_tensor;
using onnx_detail::ExternalData;

OnnxValueInfo convert_value_info(const onnx::ValueInfoProto& proto) {
  OnnxValueInfo info;
  info.name = proto.name();
  // Sequence, map and optional types stay undefined: no op kiln imports takes them.
  if (!proto.has_type() || !proto.type().has_tensor_type()) return info;
  const onnx::TypeProto::Tensor& tensor = proto.type().tensor_type();
  info.type = static_cast<OnnxElemType>(tensor.elem_type());
  if (!tensor.has_shape()) return info;
  std::vector<OnnxDim> dims;
  for (const auto& d : tensor.shape().dim()) {
    OnnxDim dim;
    if (d.has_dim_value())
      dim.value = d.dim_value();
    else if (d.has_dim_param())
      dim.param = d.dim_param();
    dims.push_back(std::move(dim));
  }
  info.shape = std::move(dims);
  return info;
}

OnnxGraph convert_graph(const onnx::GraphProto& proto, ExternalData& ext, int depth);

OnnxAttribute convert_attribute(const onnx::AttributeProto& proto, const std::string& node,
                                ExternalData& ext, int depth) {
  OnnxAttribute a;
  a.name = proto.name();
  // A proto2 enum field: numbers onnx.proto does not define are parsed as unknown fields, so
  // type() is always one of the kinds below.
  a.kind = static_cast<OnnxAttrKind>(proto.type());
  const std::string what = fmt::format("node '{}' attribute '{}'", node, a.name);
  switch (a.kind) {
    case OnnxAttrKind::kFloat:
      a.f = proto.f();
      break;
    case OnnxAttrKind::kInt:
      a.i = proto.i();
      break;
    case OnnxAttrKind::kString:
      a.s = proto.s();
      break;
    case OnnxAttrKind::kTensor:
      KILN_CHECK(proto.has_t(), "{}: {} is a tensor attribute without a tensor", ext.model_path,
                 what);
      a.tensors.push_back(decode_onnx_tensor(proto.t(), ext, what));
      break;
    case OnnxAttrKind::kGraph:
      KILN_CHECK(proto.has_g(), "{}: {} is a graph attribute without a graph", ext.model_path,
                 what);
      a.graphs.push_back(std::make_shared<OnnxGraph>(convert_graph(proto.g(), ext, depth + 1)));
      break;
    case OnnxAttrKind::kFloats:
      a.floats.assign(proto.floats().begin(), proto.floats().end());
      break;
    case OnnxAttrKind::kInts:
      a.ints.assign(proto.ints().begin(), proto.ints().end());
      break;
    case OnnxAttrKind::kStrings:
      a.strings.assign(proto.strings().begin(), proto.strings().end());
      break;
    case OnnxAttrKind::kTensors:
      for (const auto& t : proto.tensors()) a.tensors.push_back(decode_onnx_tensor(t, ext, what));
      break;
    case OnnxAttrKind::kGraphs:
      for (const auto& g : proto.graphs())
        a.graphs.push_back(std::make_shared<OnnxGraph>(convert_graph(g, ext, depth + 1)));
      break;
    case OnnxAttrKind::kSparseTensor:
    case OnnxAttrKind::kSparseTensors:
    case OnnxAttrKind::kTypeProto:
    case OnnxAttrKind::kTypeProtos:
      break;  // kept by kind: no op kiln imports takes them
    case OnnxAttrKind::kUndefined:
      KILN_FAIL("{}: {} has no type (written by a pre-2017 exporter, or damaged)", ext.model_path,
                what);
  }
  return a;
}

OnnxGraph convert_graph(const onnx::GraphProto& proto, ExternalData& ext, int depth) {
  // Protobuf's own recursion limit (100) already bounds this; the check names the file.
  KILN_CHECK(depth < 64, "{}: subgraphs nested {} deep", ext.model_path, depth);
  OnnxGraph g;
  g.name = proto.name();
  for (const auto& t : proto.initializer())
    g.initializers.push_back(decode_onnx_tensor(t, ext, fmt::format("initializer '{}'", t.name())));
  KILN_CHECK(proto.sparse_initializer_size() == 0,
             "{}: graph '{}' has sparse initializers (e.g. '{}'), which kiln does not read",
             ext.model_path, g.name, proto.sparse_initializer(0).values().name());
  for (const auto& v : proto.input()) g.inputs.push_back(convert_value_info(v));
  for (const auto& v : proto.output()) g.outputs.push_back(convert_value_info(v));
  for (const auto& v : proto.value_info()) g.value_info.push_back(convert_value_info(v));
  g.nodes.reserve(proto.node_size());
  for (int i = 0; i < proto.node_size(); ++i) {
    const onnx::NodeProto& p = proto.node(i);
    OnnxNode n;
    n.op_type = p.op_type();
    n.name = p.name().empty() ? fmt::format("{}#{}", p.op_type(), i) : p.name();
    n.domain = p.domain() == "ai.onnx" ? "" : p.domain();
    KILN_CHECK(!n.op_type.empty(), "{}: graph '{}' node '{}' has no op_type", ext.model_path,
               g.name, n.name);
    n.inputs.assign(p.input().begin(), p.input().end());
    n.outputs.assign(p.output().begin(), p.output().end());
    for (const auto& a : p.attribute())
      n.attributes.push_back(convert_attribute(a, n.name, ext, depth));
    g.nodes.push_back(std::move(n));
  }
  return g;
}

}  // namespace

const OnnxAttribute* OnnxNode::find_attribute(std::string_view attr) const {
  for (const OnnxAttribute& a : attributes)
    if (a.name == attr) return &a;
  return nullptr;
}

std::string_view onnx_attr_kind_name(OnnxAttrKind kind) {
  switch (kind) {
    case OnnxAttrKind::kUndefined:
      return "undefined";
    case OnnxAttrKind::kFloat:
      return "float";
    case OnnxAttrKind::kInt:
      return "int";
    case OnnxAttrKind::kString:
      return "string";
    case OnnxAttrKind::kTensor:
      return "tensor";
    case OnnxAttrKind::kGraph:
      return "graph";
    case OnnxAttrKind::kFloats:
      return "floats";
    case OnnxAttrKind::kInts:
      return "ints";
    case OnnxAttrKind::kStrings:
      return "strings";
    case OnnxAttrKind::kTensors:
      return "tensors";
    case OnnxAttrKind::kGraphs:
      return "graphs";
    case OnnxAttrKind::kSparseTensor:
      return "sparse_tensor";
    case OnnxAttrKind::kSparseTensors:
      return "sparse_tensors";
    case OnnxAttrKind::kTypeProto:
      return "type_proto";
    case OnnxAttrKind::kTypeProtos:
      return "type_protos";
  }
  return "unknown";
}

OnnxModel read_onnx_model(const std::string& path) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  KILN_CHECK(file->size() != 0, "{}: empty file, not an ONNX model", path);
  KILN_CHECK(file->size() < static_cast<size_t>(INT_MAX),
             "{}: {} bytes: a protobuf cannot exceed 2 GiB; save the model with external data",
             path, file->size());
  onnx::ModelProto proto;
  KILN_CHECK(proto.ParseFromArray(file->data(), static_cast<int>(file->size())),
             "{}: not an ONNX model, or a truncated or damaged one (the protobuf does not parse)",
             path);
  // The message holds copies of every byte: the file's pages need not stay resident with it.
  file.reset();
  KILN_CHECK(proto.has_graph(), "{}: no graph in the file (truncated, or not an ONNX model)", path);
  KILN_CHECK(proto.ir_version() >= 3,
             "{}: ONNX IR version {} is not supported (kiln reads IR version 3 and later)", path,
             proto.ir_version());
  OnnxModel model;
  model.path = path;
  model.ir_version = proto.ir_version();
  model.producer_name = proto.producer_name();
  model.producer_version = proto.producer_version();
  for (const auto& op : proto.opset_import()) {
    if (op.domain().empty() || op.domain() == "ai.onnx") {
      KILN_CHECK(op.version() >= kOnnxMinOpset && op.version() <= kOnnxMaxOpset,
                 "{}: opset {} of the default ONNX domain is not supported: kiln reads opsets "
                 "{} to {} (export with opset_version={})",
                 path, op.version(), kOnnxMinOpset, kOnnxMaxOpset, 17);
      model.opset = op.version();
    } else {
      model.other_opsets[op.domain()] = op.version();
    }
  }
  KILN_CHECK(model.opset != 0, "{}: imports no opset of the default ONNX domain", path);
  ExternalData ext;
  ext.model_path = path;
  ext.model_dir = std::filesystem::path(path).parent_path();
  if (ext.model_dir.empty()) ext.model_dir = ".";
  // The initializers first, each one's bytes freed from the message once decoded: the peak is
  // about one copy of the weights, not two (a 1 GiB export: 3.0 -> 2.0 GiB for
  // `kiln inspect --onnx`).
  onnx::GraphProto& graph = *proto.mutable_graph();
  std::vector<OnnxTensor> initializers;
  initializers.reserve(static_cast<size_t>(graph.initializer_size()));
  for (onnx::TensorProto& t : *graph.mutable_initializer()) {
    initializers.push_back(decode_onnx_tensor(t, ext, fmt::format("initializer '{}'", t.name())));
    std::string().swap(*t.mutable_raw_data());
  }
  graph.clear_initializer();
  model.graph = convert_graph(graph, ext, 0);
  model.graph.initializers = std::move(initializers);
  return model;
}

}  // namespace kiln
