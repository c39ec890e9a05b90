#include "graph/op_registry.h"

#include <array>

#include "graph/linear.h"

namespace kiln {
namespace schema {

const Value& in(const Graph& g, const Node& n, size_t i) {
  KILN_CHECK(
      i < n.inputs.size() && n.inputs[i] >= 0 && n.inputs[i] < static_cast<int>(g.values.size()),
      "node '{}' ({}): input {} is missing", n.name, op_name(n.op), i);
  return g.values[n.inputs[i]];
}

void expect_rank(const Node& n, const Value& v, size_t rank) {
  KILN_CHECK(v.shape.size() == rank, "node '{}' ({}): input '{}' has shape {}, expected rank {}",
             n.name, op_name(n.op), v.name, sym_shape_str(v.shape), rank);
}
void expect_float(const Node& n, const Value& v) {
  KILN_CHECK(dtype_traits(v.dtype).is_float, "node '{}' ({}): input '{}' is {}, expected a float",
             n.name, op_name(n.op), v.name, dtype_name(v.dtype));
}
void expect_dim(const Node& n, const Value& v, size_t axis, const Dim& d) {
  KILN_CHECK(v.shape.size() > axis && v.shape[axis] == d,
             "node '{}' ({}): input '{}' has shape {}, expected dim {} = {}", n.name, op_name(n.op),
             v.name, sym_shape_str(v.shape), axis,
             d.is_symbolic() ? d.symbol : std::to_string(d.value));
}
void expect_same(const Node& n, const Value& a, const Value& b) {
  KILN_CHECK(a.shape == b.shape && a.dtype == b.dtype,
             "node '{}' ({}): inputs '{}' {} {} and '{}' {} {} differ", n.name, op_name(n.op),
             a.name, dtype_name(a.dtype), sym_shape_str(a.shape), b.name, dtype_name(b.dtype),
             sym_shape_str(b.shape));
}

// x [n, d] read at the rows `rows` [r] (i64/i32) of an op's optional rows input: a gathered
// embedding's LayerNorm, a Linear of gathered rows.
void expect_gathered_rows(const Node& n, const Value& x, const Value& rows) {
  expect_rank(n, x, 2);
  expect_rank(n, rows, 1);
  KILN_CHECK(rows.dtype == DType::kI64 || rows.dtype == DType::kI32,
             "node '{}' ({}): rows '{}' must be integers, not {}", n.name, op_name(n.op), rows.name,
             dtype_name(rows.dtype));
}

}  // namespace schema

namespace {

using schema::expect_dim;
using schema::expect_float;
using schema::expect_gathered_rows;
using schema::expect_rank;
using schema::expect_same;
using schema::in;
bool has_in(const Node& n, size_t i) { return n.has_input(i); }

std::vector<ValueType> infer_embedding(const Graph& g, const Node& n) {
  const Value& table = in(g, n, 0);
  const Value& ids = in(g, n, 1);
  expect_rank(n, table, 2);
  expect_rank(n, ids, 1);
  KILN_CHECK(ids.dtype == DType::kI64 || ids.dtype == DType::kI32,
             "node '{}': ids '{}' must be integers", n.name, ids.name);
  // An i8 table carries one f32 scale per row (input 2) and gathers dequantized f32 rows; a
  // float table gathers rows of its own dtype.
  const bool per_row = table.dtype == DType::kI8;
  KILN_CHECK(per_row == has_in(n, 2), "node '{}' (Embedding): table '{}' is {}: {}", n.name,
             table.name, dtype_name(table.dtype),
             per_row ? "an i8 table needs its per-row scales (input 2)"
                     : "only i8 tables take a scales input");
  KILN_CHECK(dtype_traits(table.dtype).is_float || per_row,
             "node '{}' (Embedding): table '{}' of type {} cannot be an embedding table", n.name,
             table.name, dtype_name(table.dtype));
  if (per_row) {
    const Value& s = in(g, n, 2);
    KILN_CHECK(s.dtype == DType::kF32, "node '{}' (Embedding): scales '{}' must be f32", n.name,
               s.name);
    expect_rank(n, s, 1);
    expect_dim(n, s, 0, table.shape[0]);
    return {{DType::kF32, {ids.shape[0], table.shape[1]}}};
  }
  return {{table.dtype, {ids.shape[0], table.shape[1]}}};
}

std::vector<ValueType> infer_binary(const Graph& g, const Node& n) {
  const Value& a = in(g, n, 0);
  const Value& b = in(g, n, 1);
  expect_float(n, a);
  expect_same(n, a, b);
  return {{a.dtype, a.shape}};
}

// GatedActivation: (gate, up) of one shape, or one packed input [..., 2f] whose rows are the
// gate's f values then the up's (fuse_gate_up) -> [..., f].
std::vector<ValueType> infer_gated(const Graph& g, const Node& n) {
  if (n.inputs.size() == 2) return infer_binary(g, n);
  const Value& x = in(g, n, 0);
  expect_float(n, x);
  KILN_CHECK(!x.shape.empty() && !x.shape.back().is_symbolic() && x.shape.back().value % 2 == 0,
             "node '{}' ({}): a packed gate|up input '{}' needs an even last dim, has shape {}",
             n.name, op_name(n.op), x.name, sym_shape_str(x.shape));
  SymShape shape = x.shape;
  shape.back() = Dim::of(x.shape.back().value / 2);
  return {{x.dtype, shape}};
}

std::vector<ValueType> infer_unary(const Graph& g, const Node& n) {
  const Value& x = in(g, n, 0);
  expect_float(n, x);
  return {{x.dtype, x.shape}};
}

std::vector<ValueType> infer_rms_norm(const Graph& g, const Node& n) {
  const Value& x = in(g, n, 0);
  const Value& w = in(g, n, 1);
  expect_float(n, x);
  expect_rank(n, w, 1);
  expect_dim(n, x, x.shape.size() - 1, w.shape[0]);
  return {{x.dtype, x.shape}};
}

std::vector<ValueType> infer_layer_norm(const Graph& g, const Node& n) {
  const Value& x = in(g, n, 0);
  const Value& w = in(g, n, 1);
  const Value& b = in(g, n, 2);
  expect_float(n, x);
  expect_rank(n, w, 1);
  expect_rank(n, b, 1);
  expect_dim(n, x, x.shape.size() - 1, w.shape[0]);
  expect_dim(n, b, 0, w.shape[0]);
  if (has_in(n, 3)) {  // the rows x[rows] (a gathered embedding)
    const Value& rows = in(g, n, 3);
    expect_gathered_rows(n, x, rows);
    return {{x.dtype, {rows.shape[0], x.shape[1]}}};
  }
  return {{x.dtype, x.shape}};
}

std::vector<ValueType> infer_cast(const Graph& g, const Node& n) {
  const Value& x = in(g, n, 0);
  return {{n.attr<CastAttrs>().to, x.shape}};
}

std::vector<ValueType> infer_attention(const Graph& g, const Node& n) {
  const AttentionAttrs& a = n.attr<AttentionAttrs>();
  KILN_CHECK(a.num_heads > 0 && a.head_dim > 0, "node '{}': attention needs heads and head_dim",
             n.name);
  const Value& q = in(g, n, 0);
  expect_rank(n, q, 2);
  expect_float(n, q);
  const int64_t width = static_cast<int64_t>(a.num_heads) * a.head_dim;
  size_t next = 1;
  if (a.packed_qkv) {
    KILN_CHECK(a.kind != AttentionKind::kCross, "node '{}': cross attention cannot be packed",
               n.name);
    expect_dim(n, q, 1, Dim::of(3 * width));
  } else {
    expect_dim(n, q, 1, Dim::of(width));
    if (a.kind != AttentionKind::kCross) {
      const Value& k = in(g, n, 1);
      const Value& v = in(g, n, 2);
      expect_same(n, q, k);
      expect_same(n, q, v);
      next = 3;
    }
  }
  if (a.bias == PositionBias::kT5Relative) {
    const Value& table = in(g, n, next);
    expect_rank(n, table, 2);
    expect_dim(n, table, 0, Dim::of(a.num_buckets));
    expect_dim(n, table, 1, Dim::of(a.num_heads));
  }
  return {{q.dtype, {q.shape[0], Dim::of(width)}}};
}

std::vector<ValueType> infer_gather_rows(const Graph& g, const Node& n) {
  const Value& x = in(g, n, 0);
  const Value& rows = in(g, n, 1);
  expect_rank(n, x, 2);
  expect_rank(n, rows, 1);
  KILN_CHECK(rows.dtype == DType::kI64, "node '{}': rows '{}' must be i64", n.name, rows.name);
  return {{x.dtype, {rows.shape[0], x.shape[1]}}};
}

std::vector<ValueType> infer_add_rms_norm(const Graph& g, const Node& n) {
  const Value& a = in(g, n, 0);
  const Value& b = in(g, n, 1);
  const Value& w = in(g, n, 2);
  expect_same(n, a, b);
  expect_rank(n, w, 1);
  expect_dim(n, a, a.shape.size() - 1, w.shape[0]);
  return {{a.dtype, a.shape}, {a.dtype, a.shape}};
}

// Indexed by OpKind (checked below).
constexpr std::array<OpSchema, kNumOpKinds> kSchemas = {{
    {OpKind::kEmbedding, "Embedding", 2, 3, 1, AttrKind::kNone, infer_embedding},
    {OpKind::kLinear, "Linear", 2, kNumLinearOperands, 1, AttrKind::kLinear, infer_linear},
    {OpKind::kAdd, "Add", 2, 2, 1, AttrKind::kNone, infer_binary},
    {OpKind::kMul, "Mul", 2, 2, 1, AttrKind::kNone, infer_binary},
    {OpKind::kScale, "Scale", 1, 1, 1, AttrKind::kScale, infer_unary},
    {OpKind::kRmsNorm, "RMSNorm", 2, 2, 1, AttrKind::kNorm, infer_rms_norm},
    {OpKind::kLayerNorm, "LayerNorm", 3, 4, 1, AttrKind::kNorm, infer_layer_norm},
    {OpKind::kActivation, "Activation", 1, 1, 1, AttrKind::kActivation, infer_unary},
    {OpKind::kGatedActivation, "GatedActivation", 1, 2, 1, AttrKind::kActivation, infer_gated},
    {OpKind::kSoftmax, "Softmax", 1, 1, 1, AttrKind::kNone, infer_unary},
    {OpKind::kCast, "Cast", 1, 1, 1, AttrKind::kCast, infer_cast},
    {OpKind::kAttention, "Attention", 1, 4, 1, AttrKind::kAttention, infer_attention},
    {OpKind::kGatherRows, "GatherRows", 2, 2, 1, AttrKind::kNone, infer_gather_rows},
    {OpKind::kAddRmsNorm, "AddRMSNorm", 3, 3, 2, AttrKind::kNorm, infer_add_rms_norm},
}};

constexpr bool schemas_in_order() {
  for (int i = 0; i < kNumOpKinds; ++i)
    if (static_cast<int>(kSchemas[i].op) != i) return false;
  return true;
}
static_assert(schemas_in_order(), "kSchemas must be indexed by OpKind");

}  // namespace

const OpSchema& op_schema(OpKind op) {
  const auto i = static_cast<size_t>(op);
  KILN_CHECK(i < kSchemas.size(), "invalid op kind {}", i);
  return kSchemas[i];
}

std::string_view op_name(OpKind op) { return op_schema(op).name; }

bool parse_op_name(std::string_view name, OpKind* out) {
  for (const OpSchema& s : kSchemas) {
    if (s.name == name) {
      *out = s.op;
      return true;
    }
  }
  return false;
}

std::vector<ValueType> infer_node(const Graph& graph, const Node& node) {
  const OpSchema& s = op_schema(node.op);
  const int n = static_cast<int>(node.inputs.size());
  KILN_CHECK(n >= s.min_inputs && n <= s.max_inputs, "node '{}' ({}): {} inputs, expected {}..{}",
             node.name, s.name, n, s.min_inputs, s.max_inputs);
  KILN_CHECK(attr_kind_of(node.attrs) == s.attrs,
             "node '{}' ({}): holds {} attributes, expected {}", node.name, s.name,
             attr_kind_name(attr_kind_of(node.attrs)), attr_kind_name(s.attrs));
  return s.infer(graph, node);
}

}  // namespace kiln
