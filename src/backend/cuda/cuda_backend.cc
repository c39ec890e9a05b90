// The CUDA backend: kernels from the CUDA registry (bound to this backend's context), device
// memory, the paged KV cache on the GPU and the CUDA executor.
#include "backend/cuda/cuda_executor.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_storage.h"

namespace kiln {
namespace cuda {
namespace {

// Residual adds fused into the Linear before them (BLOOM's attention output and FFN down
// projections): the Linear reads the residual and writes the Add's output, the Add is skipped,
// saving a launch and a round trip of the activations per add. Only where the Linear's output
// feeds nothing else and the Add's output does not share workspace with the Linear's input
// (the planner may have reused that slot, which the Linear still reads while it writes).
std::vector<NodeRewrite> fuse_linear_residual(const Graph& g, int* fused) {
  std::vector<NodeRewrite> rw(g.nodes.size());
  std::vector<int> uses(g.values.size(), 0);
  for (const Node& n : g.nodes)
    for (int in : n.inputs)
      if (in >= 0) ++uses[in];
  for (int out : g.outputs) ++uses[out];
  auto slot = [&](int v) { return g.value_slot.empty() ? -1 : g.value_slot[v]; };
  *fused = 0;
  for (size_t j = 0; j < g.nodes.size(); ++j) {
    const Node& add = g.nodes[j];
    if (add.op != OpKind::kAdd || add.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const int o = add.inputs[side], r = add.inputs[1 - side], s = add.outputs[0];
      const int i = g.values[o].producer;
      if (o < 0 || r < 0 || i < 0 || uses[o] != 1 || rw[i].skip || !rw[i].outputs.empty()) continue;
      const Node& lin = g.nodes[i];
      if (lin.op != OpKind::kLinear || lin.attr<LinearAttrs>().activation) continue;
      if (lin.inputs.size() > 3 && lin.inputs[3] >= 0) continue;  // per-channel scales
      const Value &vo = g.values[o], &vr = g.values[r], &vs = g.values[s];
      if (vo.dtype != vs.dtype || vr.dtype != vs.dtype || vo.shape != vs.shape ||
          vr.shape != vs.shape)
        continue;
      const int x = lin.inputs[0];
      if (slot(s) >= 0 && slot(s) == slot(x)) continue;
      rw[i].extra_inputs = {r};
      rw[i].outputs = {s};
      rw[j].skip = true;
      ++*fused;
      break;
    }
  }
  return rw;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(Context& ctx) : ctx_(ctx), cuda_(std::make_unique<CudaContext>(ctx)) {
    register_kernels(registry_, *cuda_);
  }
  Device device() const override { return Device::kCuda; }
  std::string describe() const override {
    return fmt::format("cuda ({}, sm_{}, cuBLASLt + kiln kernels)", cuda_->device_name(),
                       cuda_->sm());
  }
  std::string target() const override { return "sm_" + std::to_string(cuda_->sm()); }
  bool supports_precision(Precision precision) const override {
    switch (precision) {
      case Precision::kFp32:
      case Precision::kFp16:
      case Precision::kBf16:
        return true;
      case Precision::kInt8:
      case Precision::kInt8Weight:
        return false;
    }
    return false;
  }
  std::string unsupported_reason(const Graph& graph, const Node& node) const override {
    const KernelKey key = kernel_key(graph, node, Device::kCuda, Isa::kSm90);
    if (registry_.find(key) != nullptr) return {};
    return fmt::format("no cuda kernel for {}", describe_key(key));
  }
  std::unique_ptr<Executable> compile(const Graph& graph, const ShapeProfile& profile) override {
    std::vector<std::unique_ptr<Kernel>> kernels;
    std::vector<std::string> names;
    for (const Node& n : graph.nodes) {
      const KernelKey key = kernel_key(graph, n, Device::kCuda, Isa::kSm90);
      const KernelRegistry::Entry* e = registry_.find(key);
      KILN_CHECK(e != nullptr, "graph '{}': node '{}' is not supported on cuda: no kernel for {}",
                 graph.name, n.name, describe_key(key));
      kernels.push_back(e->factory(n));
      kernels.back()->prepare(graph);
      names.push_back(e->name);
    }
    int fused = 0;
    std::vector<NodeRewrite> rewrites = fuse_linear_residual(graph, &fused);
    ctx_.log().debug(
        "cuda backend compiled graph '{}' ({} nodes, {} residual adds fused into "
        "linears)",
        graph.name, graph.nodes.size(), fused);
    return std::make_unique<CudaExecutor>(graph, profile, *cuda_, std::move(kernels),
                                          std::move(names), std::move(rewrites));
  }
  Allocator& allocator() override { return cuda_->allocator(); }
  std::unique_ptr<KvStorage> create_kv_storage(const KvGeometry& geometry) override {
    return std::make_unique<CudaKvStorage>(*cuda_, geometry);
  }
  bool argmax_rows(const Tensor& logits, std::span<int64_t> out, std::span<const int64_t> banned,
                   std::span<const uint8_t> banned_rows) override {
    if (logits.device() != Device::kCuda || banned.size() > BannedIds::kMax) return false;
    cuda_->argmax_rows(logits, out, banned, banned_rows);
    return true;
  }

 private:
  Context& ctx_;
  std::unique_ptr<CudaContext> cuda_;
  KernelRegistry registry_;
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(Context& ctx) {
  return std::make_unique<cuda::CudaBackend>(ctx);
}

}  // namespace kiln
