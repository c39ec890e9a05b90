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

void KernelRegistry::add(const KernelKey& key, std::string name, KernelFactory factory,
                         ExtraSet extras) {
  std::vector<Entry>& entries = entries_[key];
  for (const Entry& e : entries)
    KILN_CHECK(e.extras != extras, "kernel registered twice: {} with {}", describe_key(key),
               describe_extras(extras));
  entries.push_back(Entry{std::move(name), std::move(factory), extras});
}

namespace {

// The next narrower CPU family a key falls back to; false when there is none.
bool narrower(KernelKey* k) {
  switch (k->isa) {
    case Isa::kAvx512Bf16:
    case Isa::kAvx512Vnni:
      k->isa = Isa::kAvx512;
      return true;
    case Isa::kAvx512:
      k->isa = Isa::kAvx2;
      return true;
    case Isa::kReference:
    case Isa::kAvx2:
    case Isa::kSm90:
      return false;
  }
  return false;
}

}  // namespace

const KernelRegistry::Entry* KernelRegistry::find(const KernelKey& key, ExtraSet needed) const {
  KernelKey k = key;
  do {
    if (auto it = entries_.find(k); it != entries_.end())
      for (const Entry& e : it->second)
        if (needed.missing_from(e.extras).empty()) return &e;
  } while (narrower(&k));
  return nullptr;
}

std::string KernelRegistry::unsupported_reason(const KernelKey& key, ExtraSet needed,
                                               std::string_view backend) const {
  if (find(key, needed) != nullptr) return {};
  // What the key's kernels implement, over every family it falls back to.
  ExtraSet offered;
  bool any = false;
  KernelKey k = key;
  do {
    if (auto it = entries_.find(k); it != entries_.end())
      for (const Entry& e : it->second) {
        any = true;
        offered = offered.with(e.extras);
      }
  } while (narrower(&k));
  if (!any) {
    // Nothing for these dtypes: say so, and name the extras no kernel of the op takes at all.
    ExtraSet of_op;
    for (const auto& [k2, entries] : entries_)
      if (k2.op == key.op)
        for (const Entry& e : entries) of_op = of_op.with(e.extras);
    const ExtraSet never = needed.missing_from(of_op);
    if (never.empty()) return fmt::format("no {} kernel for {}", backend, describe_key(key));
    return fmt::format("no {} kernel for {}, and no {} {} kernel takes {}", backend,
                       describe_key(key), backend, op_name(key.op), describe_extras(never));
  }
  const ExtraSet lacking = needed.missing_from(offered);
  if (!lacking.empty())
    return fmt::format("the {} kernels for {} take no {} (they implement: {})", backend,
                       describe_key(key), describe_extras(lacking), describe_extras(offered));
  // Each extra has a kernel, but none has them all.
  return fmt::format("no {} kernel for {} implements {} together (each implements part of it)",
                     backend, describe_key(key), describe_extras(needed));
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
