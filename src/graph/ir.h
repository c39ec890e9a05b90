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
#include "graph/attrs.h"

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

// How a weight's bytes are laid out: plain row-major, or packed for a kernel (a packing id and
// the ISA / GPU architecture it was packed for), recorded per blob in plans.
struct WeightLayout {
  std::string packing;  // empty: plain row-major
  std::string target;   // e.g. "avx512", "sm_90"; empty for plain
  bool plain() const { return packing.empty(); }
  bool operator==(const WeightLayout&) const = default;
};

struct Value {
  std::string name;
  DType dtype = DType::kF32;
  SymShape shape;
  ValueKind kind = ValueKind::kActivation;
  int producer = -1;    // node index for activations
  Tensor data;          // weights only
  WeightLayout layout;  // weights only
};

enum class OpKind : uint8_t {
  kEmbedding,        // (table [vocab, d], ids [n] i64, scales? [vocab]) -> [n, d];
                     // scales (f32) only, and always, for i8 tables (rows come out f32)
  kLinear,           // (x [n, in], w [out, in], bias? [out], ...) -> [n, out]: its operands
                     // by name, its epilogue and its fused extras are graph/linear.h's
  kAdd,              // (a [n, d], b [n, d]) -> [n, d]
  kMul,              // (a [n, d], b [n, d]) -> [n, d]
  kScale,            // (x) -> x * ScaleAttrs::scale
  kRmsNorm,          // (x [n, d], w [d]) -> [n, d]; T5: no mean, no bias, fp32 variance
  kLayerNorm,        // (x [n, d], w [d], b [d], rows? [r] i64/i32) -> [n, d]; with rows
                     // (fuse_embedding_norm, CUDA plans: x is an embedding table) the
                     // normalized rows x[rows] -> [r, d]
  kActivation,       // (x) -> act(x); ActivationAttrs
  kGatedActivation,  // (gate [n, f], up [n, f]) -> act(gate) * up; or packed [n, 2f] (gate | up)
  kSoftmax,          // (x [n, d]) -> softmax over the last dim, fp32 accumulation
  kCast,             // (x) -> x as CastAttrs::to
  kAttention,        // see AttentionAttrs
  kGatherRows,       // (x [n, d], rows [r] i64) -> [r, d]
  kAddRmsNorm,       // fused (a, b, w) -> (a + b, rmsnorm(a + b)): residual add + norm
};
inline constexpr int kNumOpKinds = 14;
struct Node {
  OpKind op;
  std::string name;
  std::vector<int> inputs;  // value ids; -1 for an absent optional input
  std::vector<int> outputs;
  OpAttrs attrs;  // the alternative op_schema(op).attrs names (checked by verify_graph)

  // Whether optional input `i` is present.
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] >= 0; }

  // The node's attributes as `T`; throws naming the node when it holds another kind.
  template <typename T>
  const T& attr() const {
    const T* a = std::get_if<T>(&attrs);
    KILN_CHECK(a != nullptr, "node '{}': expected {} attributes, holds {}", name,
               attr_kind_name(static_cast<AttrKind>(OpAttrs(T{}).index())),
               attr_kind_name(attr_kind_of(attrs)));
    return *a;
  }
  template <typename T>
  T& attr() {
    return const_cast<T&>(static_cast<const Node*>(this)->attr<T>());
  }
};

struct Graph {
  std::string name;
  std::vector<Value> values;
  std::vector<Node> nodes;  // topological order
  std::vector<int> inputs;
  std::vector<int> outputs;
  // Set by the plan_memory pass: the activation buffer slot of each value (-1: not pooled —
  // inputs, weights, graph outputs that are not streamed). Empty until the pass runs. An output
  // with a slot is streamed: the executor hands it to the step's OutputSink when its node has
  // written it, and a later node may reuse its buffer. (So a pass that makes a pooled value an
  // output must run plan_memory again, as the pipeline's last step does.)
  std::vector<int> value_slot;
  int num_slots = 0;
  // Whether output `o` (a position in `outputs`) is streamed, and whether any is.
  bool streams_output(size_t o) const {
    return o < outputs.size() && static_cast<size_t>(outputs[o]) < value_slot.size() &&
           value_slot[outputs[o]] >= 0;
  }
  bool streams_outputs() const {
    for (size_t o = 0; o < outputs.size(); ++o)
      if (streams_output(o)) return true;
    return false;
  }

  // Appends a constant weight value holding `data` (dtype and shape from the tensor); returns
  // its id. Used by the builder and by passes that make new weights. During a build (a
  // WeightSpill::Scope), large weights go to the spill file and the value holds a read-only
  // mapping of them.
  int add_weight(std::string value_name, Tensor data);
  // Replaces weight `id`'s bytes (a pass converting, packing or quantizing it): the old bytes'
  // file pages are released and the new ones spilled as add_weight's. The dtype and layout
  // fields are the caller's to set.
  void set_weight_data(int id, Tensor data);
  int find_value(std::string_view value_name) const;  // -1 when absent
  int output(std::string_view value_name) const;      // value id; throws when absent
  // Position in `inputs` / `outputs` of the named graph input / output; throws when absent. The
  // runtime resolves these once and addresses inputs and outputs by position in the step loop.
  int input_index(std::string_view value_name) const;
  int output_index(std::string_view value_name) const;
  int64_t weight_bytes() const;
};

std::string_view op_name(OpKind op);
bool parse_op_name(std::string_view name, OpKind* out);

// A readable text dump: one line per node with dtypes and shapes.
std::string dump_graph(const Graph& graph);

}  // namespace kiln
