#include "backend/kernel.h"

#include <fmt/format.h>

namespace kiln {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kReference:
      return "reference";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Bf16:
      return "avx512-bf16";
    case Isa::kAvx512Vnni:
      return "avx512-vnni";
    case Isa::kSm90:
      return "sm_90";
  }
  return "?";
}

KernelKey kernel_key(const Graph& graph, const Node& node, Device device, Isa isa) {
  const DType act = node.outputs.empty() ? DType::kF32 : graph.values[node.outputs[0]].dtype;
  DType weight = act;
  for (int id : node.inputs)
    if (id >= 0 && graph.values[id].kind == ValueKind::kWeight) {
      weight = graph.values[id].dtype;
      break;
    }
  return KernelKey{node.op, act, weight, device, isa};
}

std::string describe_key(const KernelKey& k) {
  return fmt::format("{} ({} activations, {} weights) on {} {}", op_name(k.op), dtype_name(k.act),
                     dtype_name(k.weight), device_name(k.device), isa_name(k.isa));
}

void KernelRegistry::add(const KernelKey& key, std::string name, KernelFactory factory) {
  const bool fresh = entries_.emplace(key, Entry{std::move(name), std::move(factory)}).second;
  KILN_CHECK(fresh, "kernel registered twice: {}", describe_key(key));
}

const KernelRegistry::Entry* KernelRegistry::find(const KernelKey& key) const {
  KernelKey k = key;
  for (;;) {
    if (auto it = entries_.find(k); it != entries_.end()) return &it->second;
    // Each CPU family falls back to the one below it.
    if (k.isa == Isa::kAvx512Bf16 || k.isa == Isa::kAvx512Vnni)
      k.isa = Isa::kAvx512;
    else if (k.isa == Isa::kAvx512)
      k.isa = Isa::kAvx2;
    else
      return nullptr;
  }
}

std::vector<KernelKey> KernelRegistry::keys() const {
  std::vector<KernelKey> out;
  for (const auto& [k, e] : entries_) out.push_back(k);
  return out;
}

namespace {

class FunctionKernel final : public Kernel {
 public:
  FunctionKernel(const Node& node, KernelFn fn) : node_(node), fn_(fn) {}
  void run(const KernelArgs& args) override { fn_(node_, args); }

 private:
  const Node& node_;
  KernelFn fn_;
};

}  // namespace

KernelFactory function_kernel(KernelFn fn) {
  return [fn](const Node& node) { return std::make_unique<FunctionKernel>(node, fn); };
}

}  // namespace kiln
