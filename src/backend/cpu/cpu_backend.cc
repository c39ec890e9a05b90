// The CPU backend: kernels from the CPU registry (the widest family the context's ISA allows),
// host memory, and a paged KV cache in host memory that grows and shrinks in chunks.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/onednn_reference.h"
#include "backend/executor.h"

namespace kiln {
namespace {

// KV blocks in chunks of kBlocksPerChunk; a chunk is one allocation, so existing blocks never
// move when the cache grows, and trailing chunks are freed when it shrinks.
class CpuKvStorage final : public KvStorage {
 public:
  static constexpr int64_t kBlocksPerChunk = 64;

  explicit CpuKvStorage(const KvGeometry& g) : geometry_(g) {
    KILN_CHECK(g.layers > 0 && g.row_width > 0 && g.block_size > 0,
               "invalid KV cache geometry: {} layers, row width {}, block size {}", g.layers,
               g.row_width, g.block_size);
    KILN_CHECK(g.dtype == DType::kF32 || g.dtype == DType::kBF16,
               "the cpu KV cache holds f32 or bf16, not {}", dtype_name(g.dtype));
    layer_stride_ = static_cast<int64_t>(
        dtype_bytes(g.dtype, static_cast<size_t>(g.block_size * g.row_width)));  // bytes
  }
  const KvGeometry& geometry() const override { return geometry_; }
  Device device() const override { return Device::kCpu; }
  int64_t capacity() const override {
    return static_cast<int64_t>(chunks_.size()) * kBlocksPerChunk;
  }
  void resize(int64_t blocks) override {
    KILN_CHECK(blocks >= 0, "negative KV cache size {}", blocks);
    const size_t chunks = static_cast<size_t>((blocks + kBlocksPerChunk - 1) / kBlocksPerChunk);
    // Chunks given back are kept for the next request rather than freed: a fresh chunk (192 MB
    // for bloom-560m) is paid for in page faults, which on this VM made up most of a request's
    // time to first token. Nothing is zeroed: attention reads only rows it has written.
    while (chunks_.size() > chunks) {
      spare_.push_back(std::move(chunks_.back()));
      chunks_.pop_back();
    }
    while (chunks_.size() < chunks) {
      if (!spare_.empty()) {
        chunks_.push_back(std::move(spare_.back()));
        spare_.pop_back();
        continue;
      }
      chunks_.push_back(
          allocate_chunk(static_cast<size_t>(kBlocksPerChunk * geometry_.block_bytes())));
    }
  }
  int64_t bytes_allocated() const override {
    return (capacity() + static_cast<int64_t>(spare_.size()) * kBlocksPerChunk) *
           geometry_.block_bytes();
  }
  void copy_blocks(std::span<const BlockCopy> copies) override {
    for (const BlockCopy& c : copies)
      std::memcpy(base(c.dst), base(c.src), static_cast<size_t>(geometry_.block_bytes()));
  }
  void* key_block(int layer, int32_t block) override {
    return base(block) + static_cast<int64_t>(layer) * 2 * layer_stride_;
  }
  void* value_block(int layer, int32_t block) override {
    return base(block) + (static_cast<int64_t>(layer) * 2 + 1) * layer_stride_;
  }

 private:
  char* base(int32_t block) {
    KILN_CHECK(block >= 0 && block < capacity(), "KV block {} does not exist (capacity {})", block,
               capacity());
    return chunks_[block / kBlocksPerChunk].get() +
           (block % kBlocksPerChunk) * geometry_.block_bytes();
  }

  KvGeometry geometry_;
  int64_t layer_stride_ = 0;
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  using Chunk = std::unique_ptr<char[], Free>;

  // A chunk in 2 MB pages where the kernel grants them (transparent huge pages on request). A
  // decode step reads each layer's cache rows (4 KB apart for bloom-560m) after the weights have
  // streamed through the TLB: in 4 KB pages every row was a page walk, and attention took twice
  // as long (per-op timers, bloom-560m int8-weight batch 1: 2.8 -> 1.4 ms a step).
  // Chunks below a huge page (small models) stay in 4 KB pages: rounding them up would only
  // add resident memory.
  static Chunk allocate_chunk(size_t bytes) {
    constexpr size_t kHugePage = size_t{2} << 20;
    const size_t align = bytes >= kHugePage ? kHugePage : 64;
    const size_t rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    KILN_CHECK(p != nullptr, "out of memory allocating {} bytes of KV cache", rounded);
    // A hint: where it is not granted, the chunk is simply in 4 KB pages.
    if (align == kHugePage) ::madvise(p, rounded, MADV_HUGEPAGE);
    return Chunk(static_cast<char*>(p));
  }

  std::vector<Chunk> chunks_;
  std::vector<Chunk> spare_;  // chunks released by resize, reused first
};

const KernelRegistry& cpu_registry() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    cpu::register_kernels(r);
    return r;
  }();
  return registry;
}

Isa isa_of(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2:
      return Isa::kAvx2;
    case CpuIsa::kAvx512:
      return Isa::kAvx512;
  }
  return Isa::kAvx2;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Context& ctx)
      : ctx_(ctx),
        isa_(isa_of(ctx.cpu_isa())),
        kernel_isa_(ctx.cpu_bf16_dot() ? Isa::kAvx512Bf16 : isa_),
        int8_dot_(ctx.cpu_int8_dot()) {}
  Device device() const override { return Device::kCpu; }
  std::string describe() const override {
    return fmt::format("cpu ({} threads, {} kernels{})", ctx_.pool().size(), isa_name(kernel_isa_),
                       int8_dot_ ? ", avx512-vnni i8 Linears" : "");
  }
  // Plans with weights packed for a kernel family name it ("avx512"); plain plans name none
  // and run on any CPU.
  std::string target() const override { return std::string(isa_name(isa_)); }
  std::string unsupported_reason(const Graph& graph, const Node& node) const override {
    for (int id : node.inputs) {
      if (id < 0 || graph.values[id].layout.plain()) continue;
      const WeightLayout& l = graph.values[id].layout;
      if (l.target != isa_name(isa_))
        return fmt::format(
            "weight '{}' is packed as {} for {}, but this CPU runs {} kernels; rebuild the plan on "
            "this machine",
            graph.values[id].name, l.packing, l.target, isa_name(isa_));
    }
    return cpu_registry().unsupported_reason(key_of(graph, node), node_extras(node), "cpu");
  }
  std::unique_ptr<Executable> compile(const Graph& graph, const ShapeProfile& profile) override {
    std::vector<std::unique_ptr<Kernel>> kernels;
    std::vector<std::string> names;
    for (const Node& n : graph.nodes) {
      const std::string why = unsupported_reason(graph, n);
      KILN_CHECK(why.empty(), "graph '{}': node '{}' is not supported on cpu: {}", graph.name,
                 n.name, why);
      const KernelKey key = key_of(graph, n);
      const KernelRegistry::Entry* e = cpu_registry().find(key, node_extras(n));
      KILN_CHECK(e != nullptr, "graph '{}': node '{}' is not supported on cpu: no kernel for {}",
                 graph.name, n.name, describe_key(key));
      kernels.push_back(e->factory(n));
      kernels.back()->prepare(graph);
      names.push_back(e->name);
    }
    return std::make_unique<GraphExecutor>(
        graph, profile, host_allocator(), &ctx_.pool(), std::move(kernels), std::move(names),
        ctx_.options().cpu_profile.value_or(false) ? &ctx_.log() : nullptr);
  }
  // oneDNN's matmul on as many threads as kiln's pool has.
  std::optional<LibraryGemmTiming> time_library_gemm(int64_t rows, int64_t in, int64_t out,
                                                     LibraryGemmType type, int runs) override {
    return cpu::time_onednn_matmul(rows, in, out, type, static_cast<int>(ctx_.pool().size()), runs);
  }
  Allocator& allocator() override { return host_allocator(); }
  std::unique_ptr<KvStorage> create_kv_storage(const KvGeometry& geometry) override {
    return std::make_unique<CpuKvStorage>(geometry);
  }
  // bf16, int8-weight, int4-weight and int8 plans keep their KV cache in bf16 (attention widens the
  // rows as it reads them and accumulates in f32): batched decode reads each sequence's cache from
  // memory every step, and at 16 sequences of bloom-560m that was a third of the step in f32.
  TokenSelector& token_selector() override { return selector_; }
  // The context's CPU switches (core/context.h: read once from the environment).
  std::vector<BackendOption> options() const override {
    auto on_off = [](bool on) { return std::string(on ? "on" : "off"); };
    return {
        {"KILN_NUM_THREADS", std::to_string(ctx_.pool().size()), "threads of the kernels' pool"},
        {"KILN_CPU_ISA", std::string(cpu_isa_name(ctx_.cpu_isa())), "kernel family"},
        {"KILN_CPU_BF16_DOT", on_off(ctx_.cpu_bf16_dot()),
         "bf16-weight Linears in AVX512-BF16 dot products"},
        {"KILN_CPU_INT8_DOT", on_off(ctx_.cpu_int8_dot()),
         "i8- and i4-weight Linears in AVX512-VNNI dot products"},
        {"KILN_CPU_PROFILE", ctx_.options().cpu_profile.value_or(false) ? "1" : "0",
         "time every kernel, logged per class"},
    };
  }
  // kv is kAuto: a cpu plan of another is refused when it is built and when it is read.
  DType kv_cache_dtype(DType compute, Precision precision, KvCache kv) const override {
    const bool narrow = precision == Precision::kBf16 || precision == Precision::kInt8Weight ||
                        precision == Precision::kInt8 || precision == Precision::kInt4Weight;
    return compute == DType::kF32 && narrow ? DType::kBF16 : compute;
  }

 private:
  // The registry key of a node's kernel: the context's family, and for i8- and i4-weight
  // Linears the VNNI dot products where the context asks for them (independent of the bf16
  // choice).
  KernelKey key_of(const Graph& graph, const Node& node) const {
    KernelKey key = kernel_key(graph, node, Device::kCpu, kernel_isa_);
    if (int8_dot_ && key.op == OpKind::kLinear &&
        (key.weight == DType::kI8 || key.weight == DType::kI4))
      key.isa = Isa::kAvx512Vnni;
    return key;
  }

  // Greedy rows' tokens without copying the logits out (a batch of 16 bloom-560m rows is 16 MB):
  // both threads, eight lanes at a time; the rest on the host as any host selector.
  class CpuTokenSelector final : public TokenSelector {
   public:
    explicit CpuTokenSelector(Context& ctx) : ctx_(ctx) {}
    bool argmax_rows(const Tensor& logits, std::span<int64_t> out, std::span<const int64_t> banned,
                     std::span<const uint8_t> banned_rows) override {
      if (logits.device() != Device::kCpu || logits.dtype() != DType::kF32) return false;
      cpu::argmax_rows(logits, out, banned, banned_rows, ctx_.pool());
      return true;
    }

   private:
    Context& ctx_;
  };

  Context& ctx_;
  CpuTokenSelector selector_{ctx_};
  Isa isa_;         // the family weights are packed for (a plan's target)
  Isa kernel_isa_;  // the kernels: isa_, or AVX512-BF16 over the same avx512 packing
  bool int8_dot_;   // i8-weight Linears in AVX512-VNNI dot products (same avx512 packing)
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(Context& ctx) {
  return std::make_unique<CpuBackend>(ctx);
}

}  // namespace kiln
