// The CUDA backend: kernels from the CUDA registry (bound to this backend's context), device
// memory, the paged KV cache on the GPU and the CUDA executor.
#include "backend/cuda/cuda_executor.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kv_storage.h"
#include "backend/cuda_info.h"

namespace kiln {
namespace cuda {
namespace {

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
  std::string unsupported_reason(const Graph& graph, const Node& node) const override {
    return registry_.unsupported_reason(kernel_key(graph, node, Device::kCuda, Isa::kSm90),
                                        node_extras(node), "cuda");
  }
  std::string load_weights(std::span<const Graph* const> graphs) override {
    std::vector<Tensor> weights;
    for (const Graph* g : graphs)
      for (const Value& v : g->values)
        if (v.kind == ValueKind::kWeight) weights.push_back(v.data);
    const UploadStats s = cuda_->upload_weights(weights);
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
  bool argmax_rows(const Tensor& logits, std::span<int64_t> out, std::span<const int64_t> banned,
                   std::span<const uint8_t> banned_rows) override {
    if (logits.device() != Device::kCuda || banned.size() > BannedIds::kMax) return false;
    cuda_->argmax_rows(logits, out, banned, banned_rows);
    return true;
  }
  bool start_argmax_rows(const Tensor& logits, std::span<const int64_t> banned,
                         std::span<const uint8_t> banned_rows, Tensor* ids) override {
    if (logits.device() != Device::kCuda || banned.size() > BannedIds::kMax) return false;
    *ids = cuda_->start_argmax_rows(logits, banned, banned_rows);
    return true;
  }
  void finish_argmax_rows(std::span<int64_t> out) override { cuda_->finish_argmax_rows(out); }
  void edit_logits_rows(Tensor& logits, std::span<const RowEdit> edits) override {
    if (logits.device() != Device::kCuda) {
      Backend::edit_logits_rows(logits, edits);
      return;
    }
    cuda_->edit_logits_rows(logits, edits);
  }
  bool runs_ahead() const override { return true; }
  int64_t replayed_step_tokens() const override {
    return cuda_->use_graphs() ? CudaExecutor::kMaxGraphTokens : 0;
  }
  Tensor gather_ids(const Tensor& ids, std::span<const int64_t> keep,
                    std::span<const int64_t> tail) override {
    if (ids.device() != Device::kCuda) return Backend::gather_ids(ids, keep, tail);
    return cuda_->gather_ids(ids, keep, tail);
  }
  void wait() override { cuda_->synchronize(); }

  int max_top_k() const override { return CudaContext::kMaxTopK; }
  bool top_k_rows(const Tensor& logits, int k, std::span<const float> temperature,
                  std::span<const int64_t> banned, std::span<const uint8_t> banned_rows,
                  TopKRows* out) override {
    if (logits.device() != Device::kCuda || k < 1 || k > CudaContext::kMaxTopK ||
        banned.size() > BannedIds::kMax)
      return false;
    cuda_->top_k_rows(logits, k, temperature, banned, banned_rows, out);
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
  // A cuda plan on a machine without a GPU or driver: nothing the command line can change, so a
  // runtime error (exit 1), in the user's words rather than the CUDA runtime's ("CUDA driver
  // version is insufficient for CUDA runtime version" is what a missing driver looks like).
  const CudaInfo info = query_cuda();
  KILN_CHECK(info.device_count > 0,
             "device cuda: no NVIDIA GPU/driver found (CUDA: {}); this plan was built with "
             "--device cuda: rebuild it with --device cpu to run it on this machine",
             info.error.empty() ? "no device" : info.error);
  return std::make_unique<cuda::CudaBackend>(ctx);
}

}  // namespace kiln
