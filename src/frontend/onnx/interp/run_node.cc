#include "frontend/onnx/interp/run_node.h"

#include "frontend/onnx/interp/kernels.h"

namespace kiln {
namespace {

ImportTensor as_float(const ImportTensor& t) {
  return t.has_data() ? t.widened() : ImportTensor::shape_only(OnnxElemType::kFloat, t.shape());
}

ImportTensor as_half(const ImportTensor& t, OnnxElemType half) {
  return t.has_data() ? t.narrowed(half) : ImportTensor::shape_only(half, t.shape());
}

std::vector<ImportTensor> run_kernel(const ImportGraph& graph, const ImportNode& node,
                                     const std::vector<const ImportTensor*>& inputs) {
  KILN_CHECK(node.domain.empty(), "kiln's ONNX interpreter has no kernel for ops of domain '{}'",
             node.domain);
  const OpKernel* kernel = find_op_kernel(node.op_type);
  KILN_CHECK(kernel != nullptr, "kiln's ONNX interpreter has no kernel for {}", node.op_type);
  std::vector<const ImportTensor*> args = inputs;
  std::vector<ImportTensor> widened(inputs.size());
  OnnxElemType half = OnnxElemType::kUndefined;
  if (kernel->half == HalfPrecision::kComputeInFloat) {
    if (!inputs.empty() && inputs[0] != nullptr && inputs[0]->has_shape() &&
        is_half_type(inputs[0]->type()))
      half = inputs[0]->type();
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i] != nullptr && inputs[i]->has_shape() && is_half_type(inputs[i]->type())) {
        widened[i] = as_float(*inputs[i]);
        args[i] = &widened[i];
      }
  }
  for (const ImportTensor* t : args)
    if (t != nullptr && t->has_shape()) check_interpreter_type(t->type(), "an input");
  OpContext ctx(node, graph.opset(), std::move(args));
  kernel->run(ctx);
  std::vector<ImportTensor> outputs = std::move(ctx.outputs());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (node.outputs[i] < 0) {
      outputs[i] = ImportTensor();
      continue;
    }
    KILN_CHECK(outputs[i].has_shape(), "the kernel gave no output {} ('{}')", i,
               graph.values()[node.outputs[i]].name);
    if (half != OnnxElemType::kUndefined && outputs[i].type() == OnnxElemType::kFloat)
      outputs[i] = as_half(outputs[i], half);
  }
  return outputs;
}

}  // namespace

std::vector<ImportTensor> run_import_node(const ImportGraph& graph, int n,
                                          const std::vector<const ImportTensor*>& inputs) {
  const ImportNode& node = graph.nodes()[n];
  try {
    return run_kernel(graph, node, inputs);
  } catch (const Error& e) {
    throw Error(
        e.kind(),
        fmt::format("{}: node '{}' ({}): {}", graph.path(), node.name, node.op_type, e.what()),
        e.file(), e.line());
  }
}

}  // namespace kiln
