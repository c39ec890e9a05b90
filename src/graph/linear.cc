#include "graph/linear.h"

#include <fmt/format.h>

namespace kiln {

std::string_view linear_operand_name(LinearOperand o) {
  switch (o) {
    case LinearOperand::kX:
      return "x";
    case LinearOperand::kWeight:
      return "weight";
    case LinearOperand::kBias:
      return "bias";
    case LinearOperand::kWeightScales:
      return "weight scales";
    case LinearOperand::kResidual:
      return "residual";
    case LinearOperand::kNormRowSums:
      return "norm row sums";
    case LinearOperand::kNormScale:
      return "norm scale";
    case LinearOperand::kRows:
      return "rows";
    case LinearOperand::kInputScale:
      return "input scale";
  }
  return "?";
}

std::string_view extra_name(Extra e) {
  switch (e) {
    case Extra::kBias:
      return "bias";
    case Extra::kWeightScales:
      return "weight scales (per channel, or per group for i4)";
    case Extra::kActivation:
      return "fused activation";
    case Extra::kResidual:
      return "fused residual";
    case Extra::kLayerNormFold:
      return "folded input norm (layer norm)";
    case Extra::kRmsNormFold:
      return "folded input norm (rms norm)";
    case Extra::kNormScale:
      return "folded norm's scale";
    case Extra::kGatheredRows:
      return "gathered rows";
    case Extra::kWidenedOutput:
      return "widened f32 output";
    case Extra::kQuantizedInput:
      return "int8-quantized input (static scale)";
  }
  return "?";
}

std::string describe_extras(ExtraSet extras) {
  std::vector<std::string_view> names;
  for (int i = 0; i < kNumExtras; ++i)
    if (extras.has(static_cast<Extra>(i))) names.push_back(extra_name(static_cast<Extra>(i)));
  if (names.empty()) return "none";
  std::string s(names.front());
  for (size_t i = 1; i < names.size(); ++i)
    s += fmt::format("{}{}", i + 1 == names.size() ? " and " : ", ", names[i]);
  return s;
}

ExtraSet LinearDesc::extras() const {
  ExtraSet s;
  if (has(LinearOperand::kBias)) s = s.with(Extra::kBias);
  if (has(LinearOperand::kWeightScales)) s = s.with(Extra::kWeightScales);
  if (epilogue.activation) s = s.with(Extra::kActivation);
  if (has(LinearOperand::kResidual)) s = s.with(Extra::kResidual);
  if (epilogue.norm)
    s = s.with(*epilogue.norm == InputNorm::kLayerNorm ? Extra::kLayerNormFold
                                                       : Extra::kRmsNormFold);
  if (has(LinearOperand::kNormScale)) s = s.with(Extra::kNormScale);
  if (has(LinearOperand::kRows)) s = s.with(Extra::kGatheredRows);
  if (epilogue.widen) s = s.with(Extra::kWidenedOutput);
  if (has(LinearOperand::kInputScale)) s = s.with(Extra::kQuantizedInput);
  return s;
}

namespace {

void expect_linear(const Node& node) {
  KILN_CHECK(node.op == OpKind::kLinear, "node '{}' is a {}, not a Linear", node.name,
             op_name(node.op));
}

}  // namespace

LinearDesc describe_linear(const Node& node) {
  expect_linear(node);
  LinearDesc d;
  for (int o = 0; o < kNumLinearOperands; ++o)
    d.operands[o] = linear_operand(node, static_cast<LinearOperand>(o));
  d.epilogue = node.attr<LinearAttrs>().epilogue;
  return d;
}

int linear_operand(const Node& node, LinearOperand o) {
  return node.has_input(slot(o)) ? node.inputs[slot(o)] : -1;
}

void set_linear_operand(Node& node, LinearOperand o, int id) {
  expect_linear(node);
  if (node.inputs.size() <= slot(o)) {
    if (id < 0) return;
    node.inputs.resize(slot(o) + 1, -1);
  }
  node.inputs[slot(o)] = id;
}

const Tensor* linear_input(std::span<const Tensor> in, LinearOperand o) {
  return in.size() > slot(o) && in[slot(o)].defined() ? &in[slot(o)] : nullptr;
}

ExtraSet node_extras(const Node& node) {
  switch (node.op) {
    case OpKind::kLinear:
      return describe_linear(node).extras();
    case OpKind::kLayerNorm:  // the rows of a gathered embedding (fuse_embedding_norm)
      return node.has_input(3) ? ExtraSet{Extra::kGatheredRows} : ExtraSet{};
    case OpKind::kEmbedding:
    case OpKind::kAdd:
    case OpKind::kMul:
    case OpKind::kScale:
    case OpKind::kRmsNorm:
    case OpKind::kActivation:
    case OpKind::kGatedActivation:
    case OpKind::kSoftmax:
    case OpKind::kCast:
    case OpKind::kAttention:
    case OpKind::kGatherRows:
    case OpKind::kAddRmsNorm:
      return {};
  }
  return {};
}

std::vector<ValueType> infer_linear(const Graph& g, const Node& n) {
  using schema::expect_dim;
  using schema::expect_float;
  using schema::expect_rank;
  const LinearDesc d = describe_linear(n);
  const auto operand = [&](LinearOperand o) -> const Value& { return schema::in(g, n, slot(o)); };
  const Value& x = operand(LinearOperand::kX);
  const Value& w = operand(LinearOperand::kWeight);
  expect_float(n, x);
  expect_rank(n, w, 2);
  KILN_CHECK(!x.shape.empty() && x.shape.back() == w.shape[1],
             "node '{}' (Linear): input '{}' {} does not match weight '{}' {} ([out, in])", n.name,
             x.name, sym_shape_str(x.shape), w.name, sym_shape_str(w.shape));
  if (d.has(LinearOperand::kBias)) {
    const Value& b = operand(LinearOperand::kBias);
    expect_rank(n, b, 1);
    expect_dim(n, b, 0, w.shape[0]);
  }
  // Quantized weights carry their scales: an i8 weight has one f32 scale per output channel, an
  // i4 weight one f16 scale per output channel and group of kInt4Group inputs; float weights
  // have none.
  // (fp8 plans' f8_e4m3 weights carry per-channel scales as i8 weights do.)
  const bool per_channel = w.dtype == DType::kI8 || w.dtype == DType::kF8E4M3;
  const bool grouped = w.dtype == DType::kI4;
  KILN_CHECK((per_channel || grouped) == d.has(LinearOperand::kWeightScales),
             "node '{}' (Linear): weight '{}' is {}: {}", n.name, w.name, dtype_name(w.dtype),
             per_channel ? "an i8 or f8_e4m3 weight needs its per-output-channel scales (input 3)"
             : grouped   ? "an i4 weight needs its group scales (input 3)"
                         : "only i8, f8_e4m3 and i4 weights take a scales input");
  KILN_CHECK(dtype_traits(w.dtype).is_float || per_channel || grouped,
             "node '{}' (Linear): weight '{}' of type {} cannot be a Linear weight", n.name, w.name,
             dtype_name(w.dtype));
  if (per_channel) {
    const Value& s = operand(LinearOperand::kWeightScales);
    KILN_CHECK(s.dtype == DType::kF32, "node '{}' (Linear): scales '{}' must be f32", n.name,
               s.name);
    expect_rank(n, s, 1);
    expect_dim(n, s, 0, w.shape[0]);
  }
  if (grouped) {
    const Value& s = operand(LinearOperand::kWeightScales);
    KILN_CHECK(!w.shape[1].is_symbolic() && w.shape[1].value % 2 == 0,
               "node '{}' (Linear): i4 weight '{}' {} needs an even input dimension (two "
               "elements a byte)",
               n.name, w.name, sym_shape_str(w.shape));
    KILN_CHECK(s.dtype == DType::kF16,
               "node '{}' (Linear): group scales '{}' of i4 weight '{}' must be f16, not {}",
               n.name, s.name, w.name, dtype_name(s.dtype));
    expect_rank(n, s, 2);
    expect_dim(n, s, 0, w.shape[0]);
    expect_dim(n, s, 1, Dim::of(int4_groups(w.shape[1].value)));
  }
  if (d.has(LinearOperand::kInputScale)) {
    // W8A8: the product is int8 × int8, so the weight is i8 (with its scales); x is the float
    // value the calibration observed (f32 on the CPU, the activations' type on CUDA: quantized
    // from its value widened to f32), and a folded norm would rescale x after the product.
    const Value& s = operand(LinearOperand::kInputScale);
    KILN_CHECK(per_channel,
               "node '{}' (Linear): an input scale (int8 or E4M3 input) needs an i8 or f8_e4m3 "
               "weight, not {}",
               n.name, dtype_name(w.dtype));
    KILN_CHECK(x.dtype == DType::kF32 || x.dtype == DType::kF16 || x.dtype == DType::kBF16,
               "node '{}' (Linear): an int8-quantized input '{}' must be f32, f16 or bf16 (the "
               "value the scale was calibrated on), not {}",
               n.name, x.name, dtype_name(x.dtype));
    KILN_CHECK(s.dtype == DType::kF32, "node '{}' (Linear): input scale '{}' must be f32", n.name,
               s.name);
    expect_rank(n, s, 1);
    expect_dim(n, s, 0, Dim::of(1));
    KILN_CHECK(!d.epilogue.norm,
               "node '{}' (Linear): a folded norm cannot take an int8-quantized input", n.name);
  }
  SymShape out = x.shape;
  out.back() = w.shape[0];
  if (d.has(LinearOperand::kRows)) {  // the Linear of x's rows x[rows]
    const Value& rows = operand(LinearOperand::kRows);
    schema::expect_gathered_rows(n, x, rows);
    KILN_CHECK(!d.has(LinearOperand::kResidual),
               "node '{}' (Linear): gathered rows take no residual", n.name);
    out = {rows.shape[0], w.shape[0]};
  }
  const LinearEpilogue& e = d.epilogue;
  if (e.norm) {
    const bool layer = *e.norm == InputNorm::kLayerNorm;
    KILN_CHECK(e.norm_eps >= 0.0, "node '{}' (Linear): negative norm epsilon {}", n.name,
               e.norm_eps);
    // (Quantized weights fold a norm too: an i8 weight's row sums are q's and its scale
    // multiplies the normalized product; an i4 weight's are of q · its group scales;
    // fuse_norm_linear.)
    KILN_CHECK(d.has(LinearOperand::kNormRowSums) == layer,
               "node '{}' (Linear): a folded {} takes {}", n.name, input_norm_name(*e.norm),
               layer ? "the weight's row sums" : "no row sums");
    if (layer) {
      const Value& s = operand(LinearOperand::kNormRowSums);
      KILN_CHECK(s.dtype == DType::kF32, "node '{}' (Linear): row sums '{}' must be f32", n.name,
                 s.name);
      expect_rank(n, s, 1);
      expect_dim(n, s, 0, w.shape[0]);
    }
    if (d.has(LinearOperand::kNormScale)) {
      const Value& s = operand(LinearOperand::kNormScale);
      KILN_CHECK(s.dtype == DType::kF32, "node '{}' (Linear): norm scale '{}' must be f32", n.name,
                 s.name);
      expect_rank(n, s, 1);
      expect_dim(n, s, 0, w.shape[1]);
    }
  } else {
    KILN_CHECK(!d.has(LinearOperand::kNormRowSums) && !d.has(LinearOperand::kNormScale),
               "node '{}' (Linear): row sums or a norm scale without a folded norm", n.name);
  }
  if (d.has(LinearOperand::kResidual)) {
    const Value& r = operand(LinearOperand::kResidual);
    KILN_CHECK(r.dtype == x.dtype && r.shape == out && !e.activation,
               "node '{}' (Linear): residual '{}' is {} {}, expected {} {} (and no activation)",
               n.name, r.name, dtype_name(r.dtype), sym_shape_str(r.shape), dtype_name(x.dtype),
               sym_shape_str(out));
  }
  if (e.widen) {
    KILN_CHECK(x.dtype == DType::kF16 || x.dtype == DType::kBF16,
               "node '{}' (Linear): only an f16 or bf16 linear widens its output to f32, not {}",
               n.name, dtype_name(x.dtype));
    KILN_CHECK(!d.has(LinearOperand::kResidual),
               "node '{}' (Linear): a widened output takes no residual", n.name);
    return {{DType::kF32, out}};
  }
  return {{x.dtype, out}};
}

}  // namespace kiln
