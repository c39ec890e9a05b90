// Typed attributes, one struct per op family. A node holds exactly the struct its op's schema
// names (checked by the verifier), so a kernel reads `node.attr<NormAttrs>().eps` and never a
// field that means nothing for its op. Enums are stored in plans by name (attrs_to_json).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/dtype.h"

namespace kiln {

enum class Activation : uint8_t { kRelu, kGeluTanh, kGeluExact, kSilu };
std::string_view activation_name(Activation a);  // "relu", "gelu_tanh", "gelu_exact", "silu"
bool parse_activation_name(std::string_view name, Activation* out);

enum class AttentionKind : uint8_t {
  kEncoderSelf,  // keys = this step's tokens of the same sequence, no cache
  kCachedSelf,   // appends this step's K/V to the sequence's paged cache, attends to all of it
  kCross,        // keys = the sequence's cross K/V (computed once per request)
};
enum class PositionBias : uint8_t { kNone, kT5Relative, kAlibi };
std::string_view attention_kind_name(AttentionKind k);
std::string_view position_bias_name(PositionBias b);
// The norm of a Linear's input fused into it (LinearEpilogue::norm).
enum class InputNorm : uint8_t { kLayerNorm, kRmsNorm };
std::string_view input_norm_name(InputNorm n);

// Ops without attributes (Embedding, Add, Mul, Softmax, GatherRows).
struct NoAttrs {
  bool operator==(const NoAttrs&) const = default;
};

// A Linear kernel chosen by timing at build time (`kiln build --device cuda`, TensorRT's tactic
// selection) for steps of `rows` rows, and of fewer rows down to the next smaller tactic's rows
// + 1 while they are at most 64 (decode batches; cuda::tactic_for_rows: larger prompts run
// cuBLASLt's heuristic for their exact count).
struct LinearTactic {
  int64_t rows = 0;
  std::string kernel;  // "gemv" (kiln's) or "cublaslt"
  std::string algo;    // cublaslt: "<cuBLASLt version>:<hex of cublasLtMatmulAlgo_t>"
  float us = 0.0f;     // its measured time
  bool operator==(const LinearTactic&) const = default;
};

// What a Linear computes around its product besides its operands (LinearDesc, graph/linear.h):
// y = widen(activation(norm(x · wᵀ) + bias)) (+ residual). Every field is a fused extra that a
// kernel states it implements.
struct LinearEpilogue {
  std::optional<Activation> activation;  // applied to the (rounded) output
  // A LayerNorm or RMSNorm of the input folded into the Linear (CUDA plans: fuse_norm_linear):
  // operand kX is the norm's input x, the weight holds w * gamma and the bias bias + w · beta, so
  // y = rstd(x) * (x · w^T - mean(x) * row_sums) + bias (RMSNorm: rms(x)^-1 * x · w^T + bias).
  // A shared weight stays as it is and gamma comes as operand kNormScale: x · w^T above is
  // then (x * gamma) · w^T.
  std::optional<InputNorm> norm;
  double norm_eps = 0.0;
  // The output rounded to the input's type and stored as f32 (CUDA plans: fuse_linear_cast, the
  // Cast that widened the logits).
  bool widen = false;
  bool operator==(const LinearEpilogue&) const = default;
};

// Linear: what it computes (the epilogue) and how a backend may run it (tf32, tactics), which
// changes no kernel's choice of registry entry.
struct LinearAttrs {
  LinearEpilogue epilogue;
  bool tf32 = false;  // fp32 GEMMs may use TF32 tensor cores (`kiln build --tf32`, CUDA only)
  std::vector<LinearTactic> tactics;  // ascending rows; empty: the backend's own choice
  bool operator==(const LinearAttrs&) const = default;
};

struct ScaleAttrs {
  float scale = 1.0f;
  bool operator==(const ScaleAttrs&) const = default;
};

// RMSNorm, LayerNorm, AddRMSNorm.
struct NormAttrs {
  double eps = 1e-6;
  bool operator==(const NormAttrs&) const = default;
};

// Activation, GatedActivation.
struct ActivationAttrs {
  Activation activation = Activation::kRelu;
  bool operator==(const ActivationAttrs&) const = default;
};

struct CastAttrs {
  DType to = DType::kF32;
  bool operator==(const CastAttrs&) const = default;
};

// Inputs: (q [n, H*dh], k [n, H*dh], v [n, H*dh]) for self kinds, (q) for kCross, or a packed
// (qkv [n, 3*H*dh]) laid out [3, H, dh] when packed_qkv; then the relative-bias table
// [num_buckets, H] when bias == kT5Relative. Output [n, H*dh].
struct AttentionAttrs {
  AttentionKind kind = AttentionKind::kEncoderSelf;
  PositionBias bias = PositionBias::kNone;
  int layer = 0;  // which cache / cross K/V slot this op binds to
  int num_heads = 1;
  int head_dim = 1;
  bool causal = false;
  bool packed_qkv = false;
  float scale = 1.0f;  // T5: 1 (scores are not scaled); BLOOM: 1/sqrt(head_dim)
  bool bidirectional_buckets = true;
  int num_buckets = 32;
  int max_distance = 128;
  bool operator==(const AttentionAttrs&) const = default;
};

using OpAttrs = std::variant<NoAttrs, LinearAttrs, ScaleAttrs, NormAttrs, ActivationAttrs,
                             CastAttrs, AttentionAttrs>;
// Which alternative of OpAttrs an op takes (indices into the variant), named for messages.
enum class AttrKind : uint8_t { kNone, kLinear, kScale, kNorm, kActivation, kCast, kAttention };
std::string_view attr_kind_name(AttrKind k);
inline AttrKind attr_kind_of(const OpAttrs& a) { return static_cast<AttrKind>(a.index()); }

// " act=gelu_tanh", " eps=1e-06", ... for graph dumps; empty for NoAttrs.
std::string attrs_summary(const OpAttrs& attrs);
// JSON with enums by name; the reader checks every field and names `source` in errors.
nlohmann::json attrs_to_json(const OpAttrs& attrs);
OpAttrs attrs_from_json(const nlohmann::json& j, AttrKind kind, const std::string& source);

}  // namespace kiln
