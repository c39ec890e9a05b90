// The reference backend: the reference kernel table, host memory, the shared graph executor
// (single-threaded: the kernels take no thread pool) and a KV storage of separately allocated
// blocks in any float dtype.
#include "backend/reference/reference_backend.h"

#include <cstring>

#include "backend/executor.h"
#include "backend/reference/kernels.h"

namespace kiln {
namespace reference {
namespace {

// One allocation per block, so blocks never move when the storage grows or shrinks.
class ReferenceKvStorage final : public KvStorage {
 public:
  explicit ReferenceKvStorage(const KvGeometry& g) : geometry_(g) {
    KILN_CHECK(g.layers > 0 && g.row_width > 0 && g.block_size > 0,
               "invalid KV cache geometry: {} layers, row width {}, block size {}", g.layers,
               g.row_width, g.block_size);
    KILN_CHECK(dtype_traits(g.dtype).is_float && dtype_traits(g.dtype).block_elems == 1,
               "the reference KV cache holds a plain float type, not {}", dtype_name(g.dtype));
    layer_bytes_ = static_cast<int64_t>(dtype_bytes(
        g.dtype, static_cast<size_t>(static_cast<int64_t>(g.block_size) * g.row_width)));
  }
  const KvGeometry& geometry() const override { return geometry_; }
  Device device() const override { return Device::kCpu; }
  int64_t capacity() const override { return static_cast<int64_t>(blocks_.size()); }
  void resize(int64_t blocks) override {
    KILN_CHECK(blocks >= 0, "negative KV cache size {}", blocks);
    while (capacity() > blocks) blocks_.pop_back();
    while (capacity() < blocks)
      blocks_.push_back(host_allocator().allocate(static_cast<size_t>(geometry_.block_bytes())));
  }
  int64_t bytes_allocated() const override { return capacity() * geometry_.block_bytes(); }
  void copy_blocks(std::span<const BlockCopy> copies) override {
    for (const BlockCopy& c : copies)
      std::memcpy(base(c.dst), base(c.src), static_cast<size_t>(geometry_.block_bytes()));
  }
  // A block holds, per layer, block_size key rows then block_size value rows.
  void* key_block(int layer, int32_t block) override { return base(block) + slot(layer, 0); }
  void* value_block(int layer, int32_t block) override { return base(block) + slot(layer, 1); }

 private:
  char* base(int32_t block) {
    KILN_CHECK(block >= 0 && block < capacity(), "KV block {} does not exist (capacity {})", block,
               capacity());
    return static_cast<char*>(blocks_[block].get());
  }
  int64_t slot(int layer, int kv) const {
    KILN_CHECK(layer >= 0 && layer < geometry_.layers, "KV layer {} does not exist ({} layers)",
               layer, geometry_.layers);
    return (static_cast<int64_t>(layer) * 2 + kv) * layer_bytes_;
  }

  KvGeometry geometry_;
  int64_t layer_bytes_ = 0;
  std::vector<std::shared_ptr<void>> blocks_;
};

constexpr DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

const KernelRegistry& reference_registry() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    register_kernels(r);
    return r;
  }();
  return registry;
}

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(Context& ctx) : ctx_(ctx) {}
  Device device() const override { return Device::kCpu; }
  std::string describe() const override {
    return "reference (plain loops in double precision, one thread)";
  }
  std::string unsupported_reason(const Graph& graph, const Node& node) const override {
    for (int id : node.inputs)
      if (id >= 0 && !graph.values[id].layout.plain())
        return fmt::format(
            "weight '{}' is packed as {} for {}; the reference kernels read plain row-major "
            "weights (build the plan with KILN_CPU_ISA=avx2 for a plain one)",
            graph.values[id].name, graph.values[id].layout.packing, graph.values[id].layout.target);
    return reference_registry().unsupported_reason(
        kernel_key(graph, node, Device::kCpu, Isa::kReference), node_extras(node), "reference");
  }
  std::unique_ptr<Executable> compile(const Graph& graph, const ShapeProfile& profile) override {
    std::vector<std::unique_ptr<Kernel>> kernels;
    std::vector<std::string> names;
    for (const Node& n : graph.nodes) {
      const std::string why = unsupported_reason(graph, n);
      KILN_CHECK(why.empty(), "graph '{}': node '{}' is not supported by the reference backend: {}",
                 graph.name, n.name, why);
      const KernelKey key = kernel_key(graph, n, Device::kCpu, Isa::kReference);
      const KernelRegistry::Entry* e = reference_registry().find(key, node_extras(n));
      KILN_CHECK(e != nullptr,
                 "graph '{}': node '{}' is not supported by the reference backend: no kernel for "
                 "{}",
                 graph.name, n.name, describe_key(key));
      kernels.push_back(e->factory(n));
      kernels.back()->prepare(graph);
      names.push_back(e->name);
    }
    ctx_.log().debug("reference backend compiled graph '{}' ({} nodes)", graph.name,
                     graph.nodes.size());
    return std::make_unique<GraphExecutor>(graph, profile, host_allocator(), nullptr,
                                           std::move(kernels), std::move(names));
  }
  Allocator& allocator() override { return host_allocator(); }
  std::unique_ptr<KvStorage> create_kv_storage(const KvGeometry& geometry) override {
    return std::make_unique<ReferenceKvStorage>(geometry);
  }
  // --kv-cache fp8 by its definition: keys and values stored as E4M3 (scale 1) and read back.
  DType kv_cache_dtype(DType compute, Precision precision, KvCache kv) const override {
    return kv == KvCache::kFp8 ? DType::kF8E4M3 : compute;
  }

 private:
  Context& ctx_;
};

}  // namespace

void register_kernels(KernelRegistry& r) {
  struct Op {
    OpKind op;
    const char* name;
    KernelFn fn;
  };
  constexpr Op ops[] = {
      {OpKind::kEmbedding, "reference embedding", embedding},
      {OpKind::kLinear, "reference linear", linear},
      {OpKind::kAdd, "reference add", add},
      {OpKind::kMul, "reference mul", mul},
      {OpKind::kScale, "reference scale", scale},
      {OpKind::kRmsNorm, "reference rms norm", rms_norm},
      {OpKind::kLayerNorm, "reference layer norm", layer_norm},
      {OpKind::kActivation, "reference activation", activation},
      {OpKind::kGatedActivation, "reference gated activation", gated_activation},
      {OpKind::kSoftmax, "reference softmax", softmax},
      {OpKind::kCast, "reference cast", cast},
      {OpKind::kAttention, "reference attention", attention},
      {OpKind::kGatherRows, "reference gather rows", gather_rows},
      {OpKind::kAddRmsNorm, "reference add + rms norm", add_rms_norm},
  };
  static_assert(sizeof(ops) / sizeof(ops[0]) == kNumOpKinds, "every op has a reference kernel");
  // Every kernel decodes its inputs and rounds its outputs itself, so one function serves every
  // combination of float activation and weight types; the oracle implements every fused extra.
  for (const Op& op : ops)
    for (DType act : kFloatTypes)
      for (DType weight : kFloatTypes)
        r.add(KernelKey{op.op, act, weight, Device::kCpu, Isa::kReference}, op.name,
              function_kernel(op.fn), ExtraSet::all());
  // Quantized Linear weights: i8 and f8_e4m3 with per-channel scales, i4 with group scales.
  for (DType act : kFloatTypes)
    for (DType weight : {DType::kI8, DType::kI4, DType::kF8E4M3})
      r.add(KernelKey{OpKind::kLinear, act, weight, Device::kCpu, Isa::kReference},
            "reference quantized linear", function_kernel(linear), ExtraSet::all());
  // i8 embedding tables with per-row scales, gathered as f32 rows.
  r.add(KernelKey{OpKind::kEmbedding, DType::kF32, DType::kI8, Device::kCpu, Isa::kReference},
        "reference quantized embedding", function_kernel(embedding));
}

}  // namespace reference

std::unique_ptr<Backend> make_reference_backend(Context& ctx) {
  return std::make_unique<reference::ReferenceBackend>(ctx);
}

}  // namespace kiln
