// The CUDA backend: kernels from the CUDA registry (bound to this backend's context), device
// memory, the paged KV cache on the GPU and the CUDA executor.
#include "backend/cuda/cuda_executor.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_storage.h"
#include "backend/cuda/cuda_select.h"
#include "backend/cuda_info.h"

namespace kiln {
namespace cuda {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(Context& ctx, int ordinal)
      : ctx_(ctx),
        cuda_(std::make_unique<CudaContext>(ctx, ordinal, CudaOptions::from_environment())),
        select_(*cuda_) {
    register_kernels(registry_, *cuda_);
  }
  Device device() const override { return Device(Device::kCuda, cuda_->device().ordinal); }
  std::string describe() const override {
    return fmt::format("cuda ({}, sm_{}, cuBLASLt + kiln kernels)", cuda_->device().name,
                       cuda_->device().sm);
  }
  std::string target() const override { return "sm_" + std::to_string(cuda_->device().sm); }
  std::string unsupported_reason(const Graph& graph, const Node& node) const override {
    return registry_.unsupported_reason(kernel_key(graph, node, Device::kCuda, Isa::kSm90),
                                        node_extras(node), "cuda");
  }
  std::string load_weights(std::span<const Graph* const> graphs) override {
    std::vector<Tensor> weights;
    for (const Graph* g : graphs)
      for (const Value& v : g->values)
        if (v.kind == ValueKind::kWeight) weights.push_back(v.data);
    const UploadStats s = cuda_->weights().upload_weights(weights);
    if (s.copied_bytes == 0) return {};
    return fmt::format(
        "{:.2f} GB of weights uploaded in {:.0f} ms ({:.0f} ms of it setting up; {} threads, "
        "chunks of {} MiB, {:.1f} GB/s)",
        s.copied_bytes / 1e9, s.ms, s.setup_ms, s.threads, s.chunk_bytes >> 20,
        s.copied_bytes / 1e6 / s.ms);
  }
  std::unique_ptr<Executable> compile(const Graph& graph, const ShapeProfile& profile) override {
    std::vector<std::unique_ptr<Kernel>> kernels;
    std::vector<std::string> names;
    for (const Node& n : graph.nodes) {
      const std::string why = unsupported_reason(graph, n);
      KILN_CHECK(why.empty(), "graph '{}': node '{}' is not supported on cuda: {}", graph.name,
                 n.name, why);
      const KernelRegistry::Entry* e =
          registry_.find(kernel_key(graph, n, Device::kCuda, Isa::kSm90), node_extras(n));
      kernels.push_back(e->factory(n));
      kernels.back()->prepare(graph);
      names.push_back(e->name);
    }
    ctx_.log().debug("cuda backend compiled graph '{}' ({} nodes)", graph.name, graph.nodes.size());
    return std::make_unique<CudaExecutor>(graph, profile, *cuda_, std::move(kernels),
                                          std::move(names));
  }
  void select_tactics(Graph& graph, const ShapeProfile& profile) override {
    select_linear_tactics(graph, profile, *cuda_);
  }
  Allocator& allocator() override { return cuda_->allocator(); }
  std::unique_ptr<KvStorage> create_kv_storage(const KvGeometry& geometry) override {
    return std::make_unique<CudaKvStorage>(*cuda_, geometry);
  }
  // --kv-cache fp8: E4M3 keys and values (the attention kernels convert them); fp16/bf16/f32
  // otherwise, as the attention computes.
  DType kv_cache_dtype(DType compute, Precision precision, KvCache kv) const override {
    return kv == KvCache::kFp8 ? DType::kF8E4M3 : compute;
  }
  TokenSelector& token_selector() override { return select_; }
  std::vector<BackendOption> options() const override { return cuda_->options().describe(); }
  bool runs_ahead() const override { return true; }
  int64_t replayed_step_tokens() const override {
    return cuda_->options().graphs ? cuda_->options().graph_tokens : 0;
  }
  void wait() override { cuda_->checks().synchronize(); }

 private:
  Context& ctx_;
  std::unique_ptr<CudaContext> cuda_;
  CudaTokenSelector select_;  // after cuda_: goes first
  KernelRegistry registry_;
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(Context& ctx, int ordinal) {
  // A cuda plan on a machine without a GPU or driver: nothing the command line can change, so a
  // runtime error (exit 1), in the user's words rather than the CUDA runtime's ("CUDA driver
  // version is insufficient for CUDA runtime version" is what a missing driver looks like).
  const CudaInfo info = query_cuda();
  KILN_CHECK(info.device_count > 0,
             "device cuda: no NVIDIA GPU/driver found (CUDA: {}); this plan was built with "
             "--device cuda: rebuild it with --device cpu to run it on this machine",
             info.error.empty() ? "no device" : info.error);
  KILN_CHECK(ordinal >= 0 && ordinal < info.device_count,
             "device cuda:{}: this machine has {} GPU(s) (ordinals 0 to {})", ordinal,
             info.device_count, info.device_count - 1);
  return std::make_unique<cuda::CudaBackend>(ctx, ordinal);
}

}  // namespace kiln
