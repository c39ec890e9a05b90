// The CPU kernel table: which function runs each (op, dtypes, ISA). The one place CPU dispatch
// is decided; everything else asks the registry.
#include "backend/cpu/kernels.h"
#include "graph/packing.h"

namespace kiln::cpu {
namespace {

using CpuFn = void (*)(const Node&, std::span<const Tensor>, std::span<Tensor>, const KernelEnv&);

class CpuKernel final : public Kernel {
 public:
  CpuKernel(const Node& node, CpuFn fn) : node_(node), fn_(fn) {}
  void prepare(const Graph& graph) override {
    for (int id : node_.inputs)
      if (id >= 0 && graph.values[id].kind == ValueKind::kWeight) {
        packed_weight_ = graph.values[id].layout == panel16_layout();
        KILN_CHECK(packed_weight_ || graph.values[id].layout.plain(),
                   "node '{}': weight '{}' is packed as {}, which no cpu kernel reads", node_.name,
                   graph.values[id].name, graph.values[id].layout.packing);
        KILN_CHECK(!packed_weight_ || node_.op == OpKind::kEmbedding,
                   "node '{}': this cpu kernel reads plain weights, '{}' is packed", node_.name,
                   graph.values[id].name);
        break;
      }
  }
  void run(const KernelArgs& args) override {
    KILN_CHECK(args.pool != nullptr, "cpu kernel '{}' without a thread pool", node_.name);
    fn_(node_, args.in, args.out, KernelEnv{*args.pool, args.step, packed_weight_});
  }

 private:
  const Node& node_;
  CpuFn fn_;
  bool packed_weight_ = false;
};

void add_fn(KernelRegistry& r, OpKind op, DType act, DType weight, Isa isa, const char* name,
            CpuFn fn, ExtraSet extras = {}) {
  r.add(
      KernelKey{op, act, weight, Device::kCpu, isa}, name,
      [fn](const Node& node) { return std::make_unique<CpuKernel>(node, fn); }, extras);
}

// What every CPU Linear implements around its product: bias and activation, and an i8 weight's
// per-channel scales or an i4 weight's group scales. The CUDA plans' fusions (residual, folded
// norm, gathered rows, widened output) are not among them, so the CPU refuses such nodes by name.
ExtraSet linear_extras(DType weight) {
  const ExtraSet plain{Extra::kBias, Extra::kActivation};
  return weight == DType::kI8 || weight == DType::kI4 ? plain.with(Extra::kWeightScales) : plain;
}
// W8A8 Linears: an i8 weight's, and the int8 input. Registered after each family's i8-weight
// kernel, so that a node without an input scale keeps that one (the registry gives a node the
// first entry of its key that implements what it needs).
const ExtraSet kW8a8Extras = linear_extras(DType::kI8).with(Extra::kQuantizedInput);

}  // namespace

void register_kernels(KernelRegistry& r) {
  constexpr DType f32 = DType::kF32;
  constexpr Isa base = Isa::kAvx2;
  add_fn(r, OpKind::kEmbedding, f32, f32, base, "embedding gather", embedding);
  add_fn(r, OpKind::kLinear, f32, f32, base, "avx2 dot4 linear", linear_avx2, linear_extras(f32));
  add_fn(r, OpKind::kLinear, f32, DType::kBF16, base, "avx2 bf16-weight linear", linear_bf16_avx2,
         linear_extras(DType::kBF16));
  add_fn(r, OpKind::kLinear, f32, DType::kF16, base, "avx2 f16-weight linear", linear_f16_avx2,
         linear_extras(DType::kF16));
  add_fn(r, OpKind::kLinear, f32, DType::kI8, base, "avx2 i8-weight linear", linear_i8_avx2,
         linear_extras(DType::kI8));
  add_fn(r, OpKind::kLinear, f32, DType::kI8, base, "avx2 w8a8 linear (int8 × int8, vpmaddwd)",
         linear_w8a8_avx2, kW8a8Extras);
  add_fn(r, OpKind::kLinear, f32, DType::kI4, base, "avx2 i4-weight linear (vpmaddubsw)",
         linear_i4_avx2, linear_extras(DType::kI4));
  // AVX-512: one register-blocked kernel over panel16-packed weights for every weight dtype
  // and number of rows (kernels_packed.cc).
  for (DType w : {f32, DType::kBF16, DType::kF16, DType::kI8})
    r.add(KernelKey{OpKind::kLinear, f32, w, Device::kCpu, Isa::kAvx512},
          fmt::format("avx512 packed {}-weight linear", dtype_name(w)), packed_linear_factory(w),
          linear_extras(w));
  r.add(KernelKey{OpKind::kLinear, f32, DType::kI8, Device::kCpu, Isa::kAvx512},
        "avx512 packed w8a8 linear (int8 levels in f32 FMAs)", packed_w8a8_fma_linear_factory(),
        kW8a8Extras);
  r.add(KernelKey{OpKind::kLinear, f32, DType::kI4, Device::kCpu, Isa::kAvx512},
        "avx512 panel16q4 i4-weight linear (vpmaddubsw)", packed_int4_linear_factory(false),
        linear_extras(DType::kI4));
  // AVX512-BF16: bf16 weights in dot products of bf16 pairs; every other kernel is AVX-512's.
  r.add(KernelKey{OpKind::kLinear, f32, DType::kBF16, Device::kCpu, Isa::kAvx512Bf16},
        "avx512-bf16 packed bf16-weight linear (vdpbf16ps)", packed_bf16_dot_linear_factory(),
        linear_extras(DType::kBF16));
  // AVX512-VNNI: i8 and i4 weights in int8 dot products of per-row quantized activations.
  r.add(KernelKey{OpKind::kLinear, f32, DType::kI4, Device::kCpu, Isa::kAvx512Vnni},
        "avx512-vnni panel16q4 i4-weight linear (vpdpbusd)", packed_int4_linear_factory(true),
        linear_extras(DType::kI4));
  r.add(KernelKey{OpKind::kLinear, f32, DType::kI8, Device::kCpu, Isa::kAvx512Vnni},
        "avx512-vnni packed i8-weight linear (vpdpbusd)", packed_int8_dot_linear_factory(),
        linear_extras(DType::kI8));
  r.add(KernelKey{OpKind::kLinear, f32, DType::kI8, Device::kCpu, Isa::kAvx512Vnni},
        "avx512-vnni packed w8a8 linear (vpdpbusd, static input scale)",
        packed_w8a8_vnni_linear_factory(), kW8a8Extras);
  add_fn(r, OpKind::kEmbedding, DType::kBF16, DType::kBF16, base, "bf16 embedding gather",
         embedding_narrow);
  add_fn(r, OpKind::kEmbedding, DType::kF16, DType::kF16, base, "f16 embedding gather",
         embedding_narrow);
  add_fn(r, OpKind::kEmbedding, f32, DType::kI8, base, "i8 embedding gather", embedding_narrow);
  add_fn(r, OpKind::kAdd, f32, f32, base, "add", add);
  add_fn(r, OpKind::kMul, f32, f32, base, "mul", mul);
  add_fn(r, OpKind::kScale, f32, f32, base, "scale", scale);
  add_fn(r, OpKind::kRmsNorm, f32, f32, base, "rms norm", rms_norm);
  add_fn(r, OpKind::kLayerNorm, f32, f32, base, "layer norm", layer_norm);
  add_fn(r, OpKind::kActivation, f32, f32, base, "activation", activation);
  add_fn(r, OpKind::kGatedActivation, f32, f32, base, "gated activation", gated_activation);
  add_fn(r, OpKind::kGatedActivation, f32, f32, Isa::kAvx512, "avx512 gated activation",
         gated_activation_avx512);
  add_fn(r, OpKind::kSoftmax, f32, f32, base, "softmax", softmax);
  add_fn(r, OpKind::kAttention, f32, f32, base, "paged attention", attention);
  add_fn(r, OpKind::kAttention, f32, f32, Isa::kAvx512, "avx512 paged attention", attention_avx512);
  add_fn(r, OpKind::kGatherRows, f32, f32, base, "gather rows", gather_rows);
  add_fn(r, OpKind::kAddRmsNorm, f32, f32, base, "add + rms norm", add_rms_norm);
  // Casts between f32 and the narrow float types, in either direction (weights that constant
  // folding did not resolve, and activations).
  for (DType narrow : {DType::kF16, DType::kBF16}) {
    add_fn(r, OpKind::kCast, f32, narrow, base, "cast", cast);
    add_fn(r, OpKind::kCast, narrow, narrow, base, "cast", cast);
  }
  add_fn(r, OpKind::kCast, f32, f32, base, "cast", cast);
}

}  // namespace kiln::cpu
