// The CPU backend: picks a kernel per node (the one dispatch point for the CPU), binds shapes per
// step, places activations in the buffer slots the memory plan assigned, and runs the kernels.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"

namespace kiln {
namespace {

cpu::Kernel cpu_kernel(OpKind op) {
  switch (op) {
    case OpKind::kEmbedding:
      return cpu::embedding;
    case OpKind::kLinear:
      return cpu::linear;
    case OpKind::kAdd:
      return cpu::add;
    case OpKind::kMul:
      return cpu::mul;
    case OpKind::kScale:
      return cpu::scale;
    case OpKind::kRmsNorm:
      return cpu::rms_norm;
    case OpKind::kLayerNorm:
      return cpu::layer_norm;
    case OpKind::kActivation:
      return cpu::activation;
    case OpKind::kGatedActivation:
      return cpu::gated_activation;
    case OpKind::kSoftmax:
      return cpu::softmax;
    case OpKind::kCast:
      return cpu::cast;
    case OpKind::kAttention:
      return cpu::attention;
    case OpKind::kGatherRows:
      return cpu::gather_rows;
    case OpKind::kAddRmsNorm:
      return cpu::add_rms_norm;
  }
  return nullptr;
}

class CpuExecutable final : public Executable {
 public:
  CpuExecutable(Context& ctx, const Graph& graph) : ctx_(ctx), graph_(graph) {
    for (const Node& n : graph_.nodes) kernels_.push_back(cpu_kernel(n.op));
    slot_storage_.resize(static_cast<size_t>(std::max(graph_.num_slots, 0)));
    is_output_.assign(graph_.values.size(), false);
    for (int id : graph_.outputs) is_output_[id] = true;
  }

  TensorMap execute(const TensorMap& inputs, const AttentionBatch* batch) override {
    std::vector<Tensor> values(graph_.values.size());
    std::map<std::string, int64_t> bindings;
    for (int id : graph_.inputs) {
      const Value& v = graph_.values[id];
      auto it = inputs.find(v.name);
      KILN_CHECK(it != inputs.end(), "graph '{}': input '{}' was not fed", graph_.name, v.name);
      const Tensor& t = it->second;
      KILN_CHECK(t.dtype() == v.dtype, "graph '{}': input '{}' is {}, expected {}", graph_.name,
                 v.name, dtype_name(t.dtype()), dtype_name(v.dtype));
      KILN_CHECK(t.rank() == static_cast<int>(v.shape.size()),
                 "graph '{}': input '{}' has shape {}, expected {}", graph_.name, v.name,
                 shape_str(t.shape()), sym_shape_str(v.shape));
      for (size_t d = 0; d < v.shape.size(); ++d) {
        if (v.shape[d].is_symbolic()) {
          auto [pos, fresh] = bindings.emplace(v.shape[d].symbol, t.shape()[d]);
          KILN_CHECK(fresh || pos->second == t.shape()[d],
                     "graph '{}': input '{}' binds '{}' = {}, but another input bound it to {}",
                     graph_.name, v.name, v.shape[d].symbol, t.shape()[d], pos->second);
        } else {
          KILN_CHECK(t.shape()[d] == v.shape[d].value,
                     "graph '{}': input '{}' has shape {}, expected {}", graph_.name, v.name,
                     shape_str(t.shape()), sym_shape_str(v.shape));
        }
      }
      values[id] = t;
    }
    for (size_t i = 0; i < graph_.values.size(); ++i)
      if (graph_.values[i].kind == ValueKind::kWeight) values[i] = graph_.values[i].data;

    cpu::KernelEnv env{ctx_.pool(), batch, ctx_.cpu_isa()};
    std::vector<Tensor> ins, outs;
    for (size_t n = 0; n < graph_.nodes.size(); ++n) {
      const Node& node = graph_.nodes[n];
      ins.clear();
      outs.clear();
      for (int id : node.inputs) ins.push_back(id >= 0 ? values[id] : Tensor());
      for (int id : node.outputs) {
        values[id] = allocate(id, resolve_shape(graph_.values[id].shape, bindings));
        outs.push_back(values[id]);
      }
      kernels_[n](node, ins, outs, env);
    }
    TensorMap result;
    for (int id : graph_.outputs) result[graph_.values[id].name] = values[id];
    return result;
  }

  int64_t activation_bytes() const override {
    int64_t total = 0;
    for (const SlotBuffer& b : slot_storage_) total += static_cast<int64_t>(b.bytes);
    return total;
  }

 private:
  // Activations live in their slot's buffer (grown as steps get larger); graph outputs and
  // unplanned values get their own memory.
  Tensor allocate(int id, const Shape& shape) {
    const Value& v = graph_.values[id];
    const int slot = id < static_cast<int>(graph_.value_slot.size()) ? graph_.value_slot[id] : -1;
    if (slot < 0 || is_output_[id]) return Tensor::empty(v.dtype, shape);
    const size_t bytes = dtype_bytes(v.dtype, static_cast<size_t>(shape_numel(shape)));
    SlotBuffer& buffer = slot_storage_[slot];
    if (!buffer.memory || buffer.bytes < bytes) {
      const size_t rounded = std::max<size_t>((bytes + 63) / 64 * 64, 64);
      void* p = std::aligned_alloc(64, rounded);
      KILN_CHECK(p != nullptr, "out of memory: activation slot of {} bytes", rounded);
      buffer.memory = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
      buffer.bytes = rounded;
    }
    // The view keeps the buffer alive even if a later, larger value of the slot replaces it.
    return Tensor::view(v.dtype, shape, buffer.memory.get(), buffer.memory);
  }

  struct SlotBuffer {
    std::shared_ptr<void> memory;
    size_t bytes = 0;
  };

  Context& ctx_;
  const Graph& graph_;
  std::vector<cpu::Kernel> kernels_;
  std::vector<SlotBuffer> slot_storage_;
  std::vector<bool> is_output_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Context& ctx) : ctx_(ctx) {}
  Device device() const override { return Device::kCpu; }
  std::string describe() const override {
    return fmt::format("cpu ({} threads, fp32 {} kernels)", ctx_.pool().size(),
                       cpu_isa_name(ctx_.cpu_isa()));
  }
  std::string unsupported_reason(const Graph& graph, const Node& node) const override {
    for (int id : node.inputs) {
      if (id < 0) continue;
      const Value& v = graph.values[id];
      const bool index_input = (node.op == OpKind::kEmbedding && id == node.inputs[1]) ||
                               (node.op == OpKind::kGatherRows && id == node.inputs[1]);
      if (node.op == OpKind::kCast || index_input) continue;
      if (v.dtype != DType::kF32)
        return fmt::format("input '{}' is {}; the cpu backend runs {} in f32 only", v.name,
                           dtype_name(v.dtype), op_name(node.op));
    }
    return {};
  }
  std::unique_ptr<Executable> compile(const Graph& graph) override {
    for (const Node& n : graph.nodes) {
      const std::string why = unsupported_reason(graph, n);
      KILN_CHECK(why.empty(), "graph '{}': node '{}' ({}) is not supported on cpu: {}", graph.name,
                 n.name, op_name(n.op), why);
    }
    return std::make_unique<CpuExecutable>(ctx_, graph);
  }

 private:
  Context& ctx_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(Context& ctx) {
  return std::make_unique<CpuBackend>(ctx);
}

}  // namespace kiln
