// The graph IR shared by both frontends (HF checkpoints, ONNX), all passes, plans and backends.
// Values carry a dtype and a symbolic shape; nodes are kept in topological order.
//
// Activations are "ragged": the tokens of every sequence in a step are concatenated along the
// first dimension (symbol `tokens`), so a batch has no padding. Ops that must see sequence
// boundaries (Attention) read them from the AttentionBatch the runtime passes to execute().
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/hf_config.h"

namespace kiln {

// A dimension: a constant, or a named symbol bound at execution time ("tokens", "rows").
struct Dim {
  int64_t value = 0;
  std::string symbol;  // empty: constant
  static Dim of(int64_t v) { return Dim{v, {}}; }
  static Dim sym(std::string s) { return Dim{0, std::move(s)}; }
  bool is_symbolic() const { return !symbol.empty(); }
  bool operator==(const Dim&) const = default;
};
using SymShape = std::vector<Dim>;
std::string sym_shape_str(const SymShape& shape);
// Concrete shape under symbol bindings; throws naming an unbound symbol.
Shape resolve_shape(const SymShape& shape, const std::map<std::string, int64_t>& bindings);

enum class ValueKind : uint8_t {
  kInput,       // fed by the caller each execution
  kWeight,      // constant data (Value::data)
  kActivation,  // produced by a node
};

struct Value {
  std::string name;
  DType dtype = DType::kF32;
  SymShape shape;
  ValueKind kind = ValueKind::kActivation;
  int producer = -1;  // node index for activations
  Tensor data;        // weights only
};

enum class OpKind : uint8_t {
  kEmbedding,        // (table [vocab, d], ids [n] i64) -> [n, d]
  kLinear,           // (x [n, in], w [out, in], bias? [out]) -> [n, out]; attrs.activation
  kAdd,              // (a [n, d], b [n, d]) -> [n, d]
  kMul,              // (a [n, d], b [n, d]) -> [n, d]
  kScale,            // (x) -> x * attrs.scale
  kRmsNorm,          // (x [n, d], w [d]) -> [n, d]; T5: no mean, no bias, fp32 variance
  kLayerNorm,        // (x [n, d], w [d], b [d]) -> [n, d]
  kActivation,       // (x) -> act(x); attrs.activation
  kGatedActivation,  // (gate [n, f], up [n, f]) -> act(gate) * up
  kSoftmax,          // (x [n, d]) -> softmax over the last dim, fp32 accumulation
  kCast,             // (x) -> x as attrs.dtype
  kAttention,        // see AttentionAttrs
  kGatherRows,       // (x [n, d], rows [r] i64) -> [r, d]
  kAddRmsNorm,       // fused (a, b, w) -> (a + b, rmsnorm(a + b)): residual add + norm
};
inline constexpr int kNumOpKinds = 14;

enum class AttentionKind : uint8_t {
  kEncoderSelf,  // keys = this step's tokens of the same sequence, no cache
  kCachedSelf,   // appends this step's K/V to the sequence's paged cache, attends to all of it
  kCross,        // keys = the sequence's cross K/V (computed once per request)
};
enum class PositionBias : uint8_t { kNone, kT5Relative, kAlibi };

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

struct NodeAttrs {
  Activation activation = Activation::kRelu;
  bool has_activation = false;  // kLinear: fused activation present
  float scale = 1.0f;
  double eps = 1e-6;
  DType dtype = DType::kF32;
  AttentionAttrs attention;
  bool operator==(const NodeAttrs&) const = default;
};

struct Node {
  OpKind op;
  std::string name;
  std::vector<int> inputs;  // value ids; -1 for an absent optional input
  std::vector<int> outputs;
  NodeAttrs attrs;
};

struct Graph {
  std::string name;
  std::vector<Value> values;
  std::vector<Node> nodes;  // topological order
  std::vector<int> inputs;
  std::vector<int> outputs;
  // Set by the plan_memory pass: the activation buffer slot of each value (-1: not pooled —
  // inputs, weights, graph outputs). Empty until the pass runs.
  std::vector<int> value_slot;
  int num_slots = 0;

  int find_value(std::string_view value_name) const;  // -1 when absent
  int output(std::string_view value_name) const;      // throws when absent
  int64_t weight_bytes() const;
};

std::string_view op_name(OpKind op);
bool parse_op_name(std::string_view name, OpKind* out);
std::string_view attention_kind_name(AttentionKind k);
std::string_view position_bias_name(PositionBias b);

// A readable text dump: one line per node with dtypes and shapes.
std::string dump_graph(const Graph& graph);

}  // namespace kiln
