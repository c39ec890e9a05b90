// A Linear's typed description: its operands by name and the extras fused into it.
//
// y = epilogue(x · wᵀ): what a Linear computes beyond the product is named here once — its
// optional operands (LinearOperand), its epilogue (LinearEpilogue in attrs.h: activation, folded
// norm, widened output) and, derived from both, the fused extras a kernel must implement to run
// it (Extra). Kernel registry entries state the extras they implement (KernelRegistry::add), the
// registry matches a node's extras against them, and a backend's refusal is derived from that
// match (KernelRegistry::unsupported_reason): nothing else checks operand positions by hand.
//
// A new variant (W8A8's input scale was one) is an operand and/or an epilogue field here, its
// Extra, its checks in linear.cc, and the kernels that implement it (docs/adding-an-op.md).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/fp8.h"
#include "graph/ir.h"
#include "graph/op_registry.h"

namespace kiln {

// A Linear's operands. Plans store a node's inputs as a list in this order, so a new operand is
// appended and the positions never change; absent optional operands are -1 (trailing ones may be
// left out).
enum class LinearOperand : uint8_t {
  kX,             // [n, in] float: the input (with kRows, a table of rows to gather from)
  kWeight,        // [out, in] float, or i8 / i4 / f8_e4m3 with kWeightScales
  kBias,          // [out], added after the scales
  kWeightScales,  // an i8 weight's f32 [out] per-output-channel scales, or an i4 weight's f16
                  // [out, int4_groups(in)] group scales (required with i8 and i4), see below
  kResidual,      // [n, out] of y's type: added last, after rounding (fuse_linear_residual)
  kNormRowSums,   // f32 [out]: a folded LayerNorm's weight row sums (fuse_norm_linear)
  kNormScale,     // f32 [in]: a folded norm's gamma, multiplied into x (fuse_norm_linear)
  kRows,          // i64/i32 [r]: y [r, out] is the Linear of x[rows] (fuse_gather_linear)
  kInputScale,    // f32 [1]: W8A8 (fp8) — x's static per-tensor int8 (E4M3) scale s, see below
};
inline constexpr int kNumLinearOperands = 9;
static_assert(static_cast<int>(LinearOperand::kInputScale) + 1 == kNumLinearOperands);
constexpr size_t slot(LinearOperand o) { return static_cast<size_t>(o); }

// A quantized input (LinearOperand::kInputScale, an i8 weight with its per-channel scales): the
// product reads x as int8, one static scale s for the whole tensor (calibrated: threshold / 127),
// every step the same. Defined in f32 so that every kernel quantizes bit for bit alike:
//   inv = s > 0 ? 1 / s : 0;  v = x · inv, a NaN taken as 0, clamped to [-127, 127];
//   q = v rounded to the nearest integer, ties to even;
//   y = epilogue((Σ_i q[i] · w[o][i]) · s · scale[o] + bias[o]),
// the integer sum exact (kernels accumulate in int32), the rest of the epilogue (activation)
// as for any Linear. quantize_input() is the quantization, for kernels and tests alike.
inline int8_t quantize_input(float x, float inv_scale) {
  float v = x * inv_scale;
  if (v != v) v = 0.0f;  // NaN
  v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
  return static_cast<int8_t>(std::nearbyint(v));
}
// The inverse scale kernels multiply by (0 for a scale of 0: a tensor that was always 0).
inline float input_inv_scale(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }

// fp8 plans: a Linear whose weight is f8_e4m3 (with f32 per-output-channel scales, as an i8
// weight's) reads x as E4M3 with its static scale s (calibrated: threshold / 448), the same way:
//   v = x · inv, a NaN taken as 0, then E4M3 rounded to nearest even, saturating at ±448
//   (core/fp8.h);  y = epilogue((Σ_i v8[i] · w8[o][i]) · s · scale[o] + bias[o]),
// each product exact in f32 (4-bit significands), the sum in f32 on the GPU. Returns v8's value.
inline constexpr float kFp8Max = 448.0f;
inline float quantize_input_fp8(float x, float inv_scale) {
  float v = x * inv_scale;
  if (v != v) v = 0.0f;  // NaN
  return fp8_e4m3_to_float(float_to_fp8_e4m3(v));
}
// An fp8 scale from the calibration cache's int8 one (threshold / 127): threshold / 448.
inline float fp8_scale_from_int8(float int8_scale) { return int8_scale * 127.0f / kFp8Max; }

// An i4 weight (int4-weight plans): q [out, in] i4 (core/dtype.h; `in` even, so that every row
// starts on a byte) with f16 scales [out, int4_groups(in)], one per output channel and group of
// kInt4Group consecutive inputs (the last group shorter when in is not a multiple):
//   w[o][i] = q[o][i] · f32(scale[o][i / kInt4Group]),   q in [-8, 7],
// and the Linear is x · wᵀ on those values (+ bias, activation). Symmetric (no zero point);
// passes/quantize_weights.h makes them.
inline constexpr int64_t kInt4Group = 128;
constexpr int64_t int4_groups(int64_t in) { return (in + kInt4Group - 1) / kInt4Group; }
std::string_view linear_operand_name(LinearOperand o);  // "bias", "residual", ...

// What a node asks of its kernel beyond its registry key (op, dtypes, device, ISA): the extras
// fused into it. Mostly a Linear's; a LayerNorm may gather its rows too (fuse_embedding_norm).
enum class Extra : uint8_t {
  kBias,            // LinearOperand::kBias
  kWeightScales,    // LinearOperand::kWeightScales (the i8 weight's dequantization)
  kActivation,      // LinearEpilogue::activation
  kResidual,        // LinearOperand::kResidual
  kLayerNormFold,   // LinearEpilogue::norm == kLayerNorm, with LinearOperand::kNormRowSums
  kRmsNormFold,     // LinearEpilogue::norm == kRmsNorm
  kNormScale,       // LinearOperand::kNormScale
  kGatheredRows,    // LinearOperand::kRows; a LayerNorm's rows input
  kWidenedOutput,   // LinearEpilogue::widen
  kQuantizedInput,  // LinearOperand::kInputScale (W8A8: x quantized to int8 with a static scale)
};
inline constexpr int kNumExtras = 10;
static_assert(static_cast<int>(Extra::kQuantizedInput) + 1 == kNumExtras);
// "bias", "fused residual", "folded input norm (layer norm)", ... as refusals name them.
std::string_view extra_name(Extra e);

// A set of extras: what a node needs, or what a registry entry implements.
class ExtraSet {
 public:
  constexpr ExtraSet() = default;
  constexpr ExtraSet(std::initializer_list<Extra> extras) {
    for (Extra e : extras) bits_ |= bit(e);
  }
  // Every extra: the reference backend's kernels.
  static constexpr ExtraSet all() {
    ExtraSet s;
    s.bits_ = (1u << kNumExtras) - 1;
    return s;
  }
  constexpr bool has(Extra e) const { return (bits_ & bit(e)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr ExtraSet with(Extra e) const {
    ExtraSet s = *this;
    s.bits_ |= bit(e);
    return s;
  }
  constexpr ExtraSet with(ExtraSet other) const {
    ExtraSet s = *this;
    s.bits_ |= other.bits_;
    return s;
  }
  // The extras of this set that `supported` lacks.
  constexpr ExtraSet missing_from(ExtraSet supported) const {
    ExtraSet s;
    s.bits_ = bits_ & ~supported.bits_;
    return s;
  }
  constexpr bool operator==(const ExtraSet&) const = default;

 private:
  static constexpr uint32_t bit(Extra e) { return 1u << static_cast<unsigned>(e); }
  uint32_t bits_ = 0;
};
// "bias, activation and fused residual"; "none" for an empty set.
std::string describe_extras(ExtraSet extras);

// A Linear node's operands by name and its epilogue: the one view of a Linear that passes,
// kernels and backends read.
struct LinearDesc {
  std::array<int, kNumLinearOperands> operands{};  // value ids; -1: absent
  LinearEpilogue epilogue;

  int operand(LinearOperand o) const { return operands[slot(o)]; }
  bool has(LinearOperand o) const { return operand(o) >= 0; }
  // The extras a kernel must implement to run this Linear.
  ExtraSet extras() const;
};
// Throws naming the node when it is not a Linear.
LinearDesc describe_linear(const Node& node);

// Operand `o` of Linear `node`: a value id, or -1 when absent.
int linear_operand(const Node& node, LinearOperand o);
// Sets operand `o` of Linear `node` to value `id` (-1: absent), growing its input list.
void set_linear_operand(Node& node, LinearOperand o, int id);
// A Linear kernel's operand `o` among its inputs (KernelArgs::in); null when absent.
const Tensor* linear_input(std::span<const Tensor> in, LinearOperand o);

// The extras of any node (empty for ops that have none): what kernel registries match on.
ExtraSet node_extras(const Node& node);

// The Linear's schema: checks every operand against the description and returns y's type.
std::vector<ValueType> infer_linear(const Graph& graph, const Node& node);

}  // namespace kiln
