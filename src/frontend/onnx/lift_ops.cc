#include "frontend/onnx/lift_ops.h"

#include <cmath>
#include <map>
#include <set>

namespace kiln {
namespace {

bool is_elementwise(std::string_view op) {
  return op == "Add" || op == "Mul" || op == "Sub" || op == "Div" || op == "Pow" || op == "Cast" ||
         op == "Identity" || op == "Tanh" || op == "Erf" || op == "Sqrt" || op == "Neg" ||
         op == "Reciprocal";
}

Tensor kiln_tensor(const ImportTensor& t) { return t.to_kiln(); }

// A [rows, cols] float tensor of deterministic values in [-lo, lo].
ImportTensor probe_values(int64_t rows, int64_t cols, float range) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = range * std::sin(0.7f * static_cast<float>(i) + 0.3f);
  return ImportTensor::from_vector(OnnxElemType::kFloat, {rows, cols}, v);
}

// The probe in `x`'s element type (float16/bfloat16 exports compute in it), and how close a
// subgraph's result must then be to the formula's.
ImportTensor probe_as(const PatternGraph& g, int x, const ImportTensor& probe) {
  const OnnxElemType type = g.probe_type(x);
  return is_half_type(type) ? probe.narrowed(type) : probe;
}
double tolerance(const PatternGraph& g, int x, double fp32) {
  return is_half_type(g.probe_type(x)) ? 3e-2 : fp32;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// Whether a ReduceMean node averages over the last axis of `x` only (axes attribute up to opset
// 17, an input from 18).
bool reduces_last_axis(const PatternGraph& g, const ImportNode& mean, int x) {
  std::vector<int64_t> axes;
  if (const OnnxAttribute* a = mean.find_attribute("axes")) axes = a->ints;
  if (mean.inputs.size() > 1 && mean.inputs[1] >= 0) {
    const ImportTensor* t = g.constant(mean.inputs[1]);
    if (!t) return false;
    axes = t->to_int64s();
  }
  const std::optional<Shape> shape = g.probe_shape(x);
  if (axes.size() != 1 || !shape) return false;
  return axes[0] == -1 || axes[0] == static_cast<int64_t>(shape->size()) - 1;
}

// Lifting reads nodes' inputs and first output by position: a node of an op it reads must
// have them (the interpreter would refuse it too, but only when it runs).
void check_arity(const ImportGraph& graph) {
  static const std::map<std::string_view, size_t> kRequiredInputs = {
      {"Add", 2},        {"Sub", 2},     {"Mul", 2},       {"Div", 2},
      {"Pow", 2},        {"MatMul", 2},  {"Gather", 2},    {"LayerNormalization", 2},
      {"ReduceMean", 1}, {"Softmax", 1}, {"Sqrt", 1},      {"Tanh", 1},
      {"Erf", 1},        {"Cast", 1},    {"Identity", 1},  {"Reshape", 2},
      {"Transpose", 1},  {"Squeeze", 1}, {"Unsqueeze", 1}, {"Relu", 1},
      {"Log", 1},        {"Neg", 1},     {"CumSum", 2},    {"Reciprocal", 1}};
  for (const ImportNode& node : graph.nodes()) {
    if (!node.domain.empty()) continue;
    const auto it = kRequiredInputs.find(node.op_type);
    if (it == kRequiredInputs.end()) continue;
    bool ok = node.inputs.size() >= it->second && !node.outputs.empty() && node.outputs[0] >= 0;
    for (size_t i = 0; ok && i < it->second; ++i) ok = node.inputs[i] >= 0;
    KILN_CHECK(ok,
               "{}: node '{}' ({}) has {} input(s) and {} output(s); {} needs {} input(s) and "
               "an output",
               graph.path(), node.name, node.op_type, node.inputs.size(), node.outputs.size(),
               node.op_type, it->second);
  }
}

struct Lifter {
  const PatternGraph& g;
  const Logger& log;
  LiftResult r;

  void record(LiftedOp op) {
    const int index = static_cast<int>(r.ops.size());
    for (int n : op.nodes) r.op_of_node[n] = index;
    log.debug("lift: {} at '{}' ({} nodes)", op.summary(), op.anchor, op.nodes.size());
    r.ops.push_back(std::move(op));
  }
  void fail(std::string pattern, const ImportNode& node, std::string reason) {
    log.debug("lift: {} at '{}' did not match: {}", pattern, node.name, reason);
    r.failures.push_back({std::move(pattern), node.name, std::move(reason)});
  }
  bool covered(int n) const { return r.op_of_node[n] >= 0; }

  void overflow_clamps() {
    for (int n : g.graph().order()) {
      if (g.overflow_clamp(n).empty()) continue;
      LiftedOp op;
      op.kind = LiftedKind::kOverflowClamp;
      op.anchor = g.node(n).name;
      op.input = g.node(n).inputs[0];
      op.output = g.node(n).outputs[0];
      op.nodes = g.overflow_clamp(n);
      record(std::move(op));
    }
  }

  void embeddings() {
    for (int n : g.graph().order()) {
      const ImportNode& node = g.node(n);
      if (node.op_type != "Gather" || node.inputs.size() != 2) continue;
      const OnnxAttribute* a = node.find_attribute("axis");
      if (a && a->i != 0) continue;
      const ImportTensor* table = g.constant(node.inputs[0]);
      if (!table || table->rank() != 2 || !is_float_type(table->type())) continue;
      const int ids = g.through_casts(node.inputs[1]);
      if (g.graph().values()[ids].kind != ImportValueKind::kInput) continue;
      LiftedOp op{LiftedKind::kEmbedding, node.name, ids, node.outputs[0], {n}};
      op.weight = kiln_tensor(*table);
      record(std::move(op));
    }
  }

  void linears() {
    for (int n : g.graph().order()) {
      const ImportNode& node = g.node(n);
      if (node.op_type != "MatMul" || covered(n)) continue;
      const ImportTensor* w = g.constant(node.inputs[1]);
      if (!w || g.constant(node.inputs[0])) continue;
      if (w->rank() != 2 || !is_float_type(w->type())) {
        fail("linear", node,
             fmt::format("the weight is {}, not a 2-D float matrix", w->describe()));
        continue;
      }
      LiftedOp op{LiftedKind::kLinear, node.name, node.inputs[0], node.outputs[0], {n}};
      op.weight = transposed_2d(*w);
      const int add = g.sole_user(node.outputs[0], "Add");
      if (add >= 0 && g.users(node.outputs[0]).size() == 1) {
        const int other = g.non_constant_input(add);
        const ImportTensor* b = other >= 0 ? g.constant(g.node(add).inputs[1 - other]) : nullptr;
        if (b && b->rank() == 1 && b->dim(0) == w->dim(1)) {
          op.bias = kiln_tensor(*b);
          op.nodes.push_back(add);
          op.output = g.node(add).outputs[0];
        }
      }
      record(std::move(op));
    }
  }

  void layer_norms() {
    for (int n : g.graph().order()) {
      const ImportNode& node = g.node(n);
      if (node.op_type != "LayerNormalization") continue;
      const OnnxAttribute* axis = node.find_attribute("axis");
      const ImportTensor* scale = g.constant(node.inputs.at(1));
      const ImportTensor* bias = node.inputs.size() > 2 ? g.constant(node.inputs[2]) : nullptr;
      const std::optional<Shape> shape = g.probe_shape(node.inputs[0]);
      if (!scale || scale->rank() != 1 ||
          (node.inputs.size() > 2 && node.inputs[2] >= 0 && !bias)) {
        fail("layer_norm", node, "scale and bias are not 1-D constants");
        continue;
      }
      if (axis && axis->i != -1 && !(shape && axis->i == static_cast<int64_t>(shape->size()) - 1)) {
        fail("layer_norm", node, fmt::format("normalizes from axis {}, not the last", axis->i));
        continue;
      }
      LiftedOp op{LiftedKind::kLayerNorm, node.name, node.inputs[0], node.outputs[0], {n}};
      op.weight = kiln_tensor(*scale);
      if (bias) op.bias = kiln_tensor(*bias);
      const OnnxAttribute* eps = node.find_attribute("epsilon");
      op.eps = eps ? static_cast<double>(eps->f) : 1e-5;
      record(std::move(op));
    }
  }

  // torch's LayerNorm before opset 17: d = x - mean(x); d / sqrt(mean(d^2) + eps) * w [+ b].
  void layer_norm_decompositions() {
    for (int n : g.graph().order()) {
      const ImportNode& mean = g.node(n);
      if (mean.op_type != "ReduceMean" || covered(n)) continue;
      const int x = g.through_casts(mean.inputs[0]);
      int sub = -1;
      for (int u : g.users(mean.outputs[0])) {
        const ImportNode& node = g.node(u);
        if (node.op_type == "Sub" && node.inputs[1] == mean.outputs[0] &&
            g.through_casts(node.inputs[0]) == x)
          sub = u;
      }
      if (sub < 0) continue;  // not a mean subtraction
      const int d = g.node(sub).outputs[0];
      auto step = [&](int v, std::string_view op) { return v >= 0 ? g.sole_user(v, op) : -1; };
      const int pow = step(d, "Pow");
      const int var = pow >= 0 && g.scalar(g.node(pow).inputs[1]) == 2.0
                          ? step(g.node(pow).outputs[0], "ReduceMean")
                          : -1;
      const int add = var >= 0 ? step(g.node(var).outputs[0], "Add") : -1;
      const int add_in = add >= 0 ? g.non_constant_input(add) : -1;
      const std::optional<double> eps =
          add_in >= 0 ? g.scalar(g.node(add).inputs[1 - add_in]) : std::nullopt;
      const int sqrt = eps ? step(g.node(add).outputs[0], "Sqrt") : -1;
      const int div = step(sqrt >= 0 ? g.node(sqrt).outputs[0] : -1, "Div");
      if (div < 0 || g.through_casts(g.node(div).inputs[0]) != d) {
        fail("layer_norm", mean, "x - mean(x) is not divided by sqrt(mean((x - mean(x))^2) + eps)");
        continue;
      }
      if (!reduces_last_axis(g, mean, x) || !reduces_last_axis(g, g.node(var), d)) {
        fail("layer_norm", mean, "the means are not over the last axis");
        continue;
      }
      const int mul = step(g.node(div).outputs[0], "Mul");
      const int mul_in = mul >= 0 ? g.non_constant_input(mul) : -1;
      const ImportTensor* w = mul_in >= 0 ? g.constant(g.node(mul).inputs[1 - mul_in]) : nullptr;
      if (!w || w->rank() != 1) {
        fail("layer_norm", mean, "the normalized value is not multiplied by a 1-D weight");
        continue;
      }
      int out = g.node(mul).outputs[0];
      const ImportTensor* b = nullptr;
      const int bias = g.sole_user(out, "Add");
      if (bias >= 0 && g.non_constant_input(bias) >= 0) {
        const ImportTensor* c = g.constant(g.node(bias).inputs[1 - g.non_constant_input(bias)]);
        if (c && c->rank() == 1 && c->dim(0) == w->dim(0)) {
          b = c;
          out = g.node(bias).outputs[0];
        }
      }
      const std::vector<int> nodes = g.region(x, out);
      if (nodes.empty() || !g.region_is_closed(nodes, out, x)) {
        fail("layer_norm", mean, "values inside the norm are read elsewhere");
        continue;
      }
      const int64_t dim = w->dim(0);
      const ImportTensor probe = probe_as(g, x, probe_values(3, dim, 2.0f));
      std::vector<float> got;
      try {
        got = g.run_region(nodes, x, probe, out).to_floats();
      } catch (const Error& e) {
        fail("layer_norm", mean, e.what());
        continue;
      }
      const std::vector<float> px = probe.to_floats(), pw = w->to_floats();
      const std::vector<float> pb = b ? b->to_floats() : std::vector<float>(pw.size(), 0.0f);
      std::vector<float> want(px.size());
      for (int64_t row = 0; row < 3; ++row) {
        double mu = 0, var_sum = 0;
        for (int64_t i = 0; i < dim; ++i) mu += px[row * dim + i];
        mu /= double(dim);
        for (int64_t i = 0; i < dim; ++i)
          var_sum += (px[row * dim + i] - mu) * (px[row * dim + i] - mu);
        const double inv = 1.0 / std::sqrt(var_sum / double(dim) + *eps);
        for (int64_t i = 0; i < dim; ++i)
          want[row * dim + i] = static_cast<float>((px[row * dim + i] - mu) * inv * pw[i] + pb[i]);
      }
      if (max_diff(got, want) > tolerance(g, x, 1e-4)) {
        fail("layer_norm", mean,
             "the subgraph does not compute (x - mean) / sqrt(var + eps) * w + b");
        continue;
      }
      LiftedOp op{LiftedKind::kLayerNorm, mean.name, x, out, nodes};
      op.weight = kiln_tensor(*w);
      if (b) op.bias = kiln_tensor(*b);
      op.eps = *eps;
      record(std::move(op));
    }
  }

  // T5LayerNorm: x * 1/sqrt(mean(x^2) + eps) * w (or x / sqrt(...) * w).
  void rms_norms() {
    for (int n : g.graph().order()) {
      const ImportNode& pow = g.node(n);
      if (pow.op_type != "Pow" || covered(n) || g.scalar(pow.inputs.at(1)) != 2.0) continue;
      const int x = g.through_casts(pow.inputs[0]);
      const int mean = g.sole_user(pow.outputs[0], "ReduceMean");
      if (mean < 0) continue;
      const int add = g.sole_user(g.node(mean).outputs[0], "Add");
      const int other = add >= 0 ? g.non_constant_input(add) : -1;
      const std::optional<double> eps =
          other >= 0 ? g.scalar(g.node(add).inputs[1 - other]) : std::nullopt;
      if (!eps) {
        fail("rms_norm", pow, "mean(x^2) is not followed by + eps");
        continue;
      }
      if (!reduces_last_axis(g, g.node(mean), x)) {
        fail("rms_norm", pow, "the mean is not over the last axis");
        continue;
      }
      const int sqrt = g.sole_user(g.node(add).outputs[0], "Sqrt");
      if (sqrt < 0) {
        fail("rms_norm", pow, "no Sqrt of mean(x^2) + eps");
        continue;
      }
      // The normalized value: Mul(x, Div(1, sqrt)) or Div(x, sqrt).
      const int div = g.sole_user(g.node(sqrt).outputs[0], "Div");
      if (div < 0) {
        fail("rms_norm", pow, "sqrt(mean(x^2) + eps) is not divided by");
        continue;
      }
      int normed = g.node(div).outputs[0];
      if (g.scalar(g.node(div).inputs[0]) == 1.0) {
        const int mul = g.sole_user(normed, "Mul");
        if (mul < 0) {
          fail("rms_norm", pow, "1/sqrt(...) is not multiplied by x");
          continue;
        }
        normed = g.node(mul).outputs[0];
      }
      const int scale = g.sole_user(normed, "Mul");
      const int scale_in = scale >= 0 ? g.non_constant_input(scale) : -1;
      const ImportTensor* w =
          scale_in >= 0 ? g.constant(g.node(scale).inputs[1 - scale_in]) : nullptr;
      if (!w || w->rank() != 1) {
        fail("rms_norm", pow, "the normalized value is not multiplied by a 1-D weight");
        continue;
      }
      const int out = g.node(scale).outputs[0];
      const std::vector<int> nodes = g.region(x, out);
      if (nodes.empty() || !g.region_is_closed(nodes, out, x)) {
        fail("rms_norm", pow, "values inside the norm are read elsewhere");
        continue;
      }
      // The matched subgraph must compute RMSNorm: run it on probe rows.
      const int64_t d = w->dim(0);
      const ImportTensor probe = probe_as(g, x, probe_values(3, d, 2.0f));
      const std::vector<float> got = g.run_region(nodes, x, probe, out).to_floats();
      const std::vector<float> px = probe.to_floats(), pw = w->to_floats();
      std::vector<float> want(px.size());
      for (int64_t row = 0; row < 3; ++row) {
        double ss = 0;
        for (int64_t i = 0; i < d; ++i) ss += double(px[row * d + i]) * px[row * d + i];
        const double inv = 1.0 / std::sqrt(ss / double(d) + *eps);
        for (int64_t i = 0; i < d; ++i)
          want[row * d + i] = static_cast<float>(px[row * d + i] * inv * pw[i]);
      }
      if (max_diff(got, want) > tolerance(g, x, 1e-4)) {
        fail("rms_norm", pow, "the subgraph does not compute x / sqrt(mean(x^2) + eps) * w");
        continue;
      }
      LiftedOp op{LiftedKind::kRmsNorm, pow.name, x, out, nodes};
      op.weight = kiln_tensor(*w);
      op.eps = *eps;
      record(std::move(op));
    }
  }

  void gelus() {
    for (int n : g.graph().order()) {
      const ImportNode& anchor = g.node(n);
      if ((anchor.op_type != "Tanh" && anchor.op_type != "Erf") || covered(n)) continue;
      // x: the one non-constant value the anchor's input is computed from elementwise.
      std::set<int> roots;
      std::vector<int> stack{g.through_casts(anchor.inputs[0])};
      std::set<int> seen;
      while (!stack.empty()) {
        const int v = stack.back();
        stack.pop_back();
        if (!seen.insert(v).second || g.constant(v)) continue;
        const int p = g.producer(v);
        if (p < 0 || r.op_computing(v) >= 0 || !is_elementwise(g.node(p).op_type)) {
          roots.insert(v);
          continue;
        }
        for (int in : g.node(p).inputs) stack.push_back(g.through_casts(in));
      }
      if (roots.size() != 1) {
        fail("gelu", anchor, fmt::format("its input depends on {} values, not one", roots.size()));
        continue;
      }
      const int x = *roots.begin();
      // Values computed from x elementwise; the output is the last such value on the anchor's
      // chain whose other inputs are constants or from x.
      std::set<int> derived{x};
      for (int m : g.graph().order()) {
        const ImportNode& node = g.node(m);
        if (!is_elementwise(node.op_type)) continue;
        bool from_x = false, closed = true;
        for (int in : node.inputs) {
          if (in < 0) continue;
          if (derived.count(in))
            from_x = true;
          else if (!g.constant(in))
            closed = false;
        }
        if (from_x && closed)
          for (int o : node.outputs) derived.insert(o);
      }
      int out = anchor.outputs[0];
      while (g.users(out).size() == 1) {
        const ImportNode& next = g.node(g.users(out)[0]);
        if (!is_elementwise(next.op_type) || !derived.count(next.outputs[0])) break;
        out = next.outputs[0];
      }
      const std::vector<int> nodes = g.region(x, out);
      if (nodes.empty() || !g.region_is_closed(nodes, out)) {
        fail("gelu", anchor, "values inside the activation are read elsewhere");
        continue;
      }
      std::vector<float> px;
      for (int i = 0; i <= 48; ++i) px.push_back(-6.0f + 0.25f * static_cast<float>(i));
      const ImportTensor probe =
          probe_as(g, x, ImportTensor::from_vector(OnnxElemType::kFloat, {49}, px));
      px = probe.to_floats();
      std::vector<float> got;
      try {
        got = g.run_region(nodes, x, probe, out).to_floats();
      } catch (const Error& e) {
        fail("gelu", anchor, e.what());
        continue;
      }
      std::vector<float> tanh_gelu, erf_gelu;
      for (float v : px) {
        const double d = v;
        tanh_gelu.push_back(static_cast<float>(
            0.5 * d * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (d + 0.044715 * d * d * d)))));
        erf_gelu.push_back(static_cast<float>(0.5 * d * (1.0 + std::erf(d / std::sqrt(2.0)))));
      }
      LiftedOp op{LiftedKind::kGelu, anchor.name, x, out, nodes};
      const double tol = tolerance(g, x, 1e-5);
      // fp32: the two formulas differ by up to 1e-3, far beyond the tolerance; half types round
      // both alike, so the nearer one is the activation.
      const double to_tanh = max_diff(got, tanh_gelu), to_erf = max_diff(got, erf_gelu);
      if (to_tanh <= tol && to_tanh <= to_erf) {
        op.activation = Activation::kGeluTanh;
      } else if (to_erf <= tol) {
        op.activation = Activation::kGeluExact;
      } else {
        fail("gelu", anchor,
             fmt::format("the subgraph computes neither tanh GELU (max difference {:.3g}) nor "
                         "erf GELU ({:.3g})",
                         to_tanh, to_erf));
        continue;
      }
      record(std::move(op));
    }
  }

  void attentions() {
    for (int n : g.graph().order()) {
      if (g.node(n).op_type != "Softmax" || covered(n)) continue;
      LiftedOp op;
      PatternFailure failure;
      if (lift_attention(g, r, n, &op, &failure)) {
        record(std::move(op));
      } else {
        log.debug("lift: {} at '{}' did not match: {}", failure.pattern, failure.node,
                  failure.reason);
        r.failures.push_back(std::move(failure));
      }
    }
  }
};

}  // namespace

std::string_view lifted_kind_name(LiftedKind kind) {
  switch (kind) {
    case LiftedKind::kEmbedding:
      return "embedding";
    case LiftedKind::kLinear:
      return "linear";
    case LiftedKind::kLayerNorm:
      return "layer_norm";
    case LiftedKind::kRmsNorm:
      return "rms_norm";
    case LiftedKind::kGelu:
      return "gelu";
    case LiftedKind::kAttention:
      return "attention";
    case LiftedKind::kOverflowClamp:
      return "fp16_clamp";
  }
  return "?";
}

std::string LiftedOp::summary() const {
  switch (kind) {
    case LiftedKind::kEmbedding:
      return fmt::format("embedding {}", shape_str(weight.shape()));
    case LiftedKind::kLinear:
      return fmt::format("linear {} -> {}{}", weight.dim(1), weight.dim(0),
                         bias.defined() ? " + bias" : "");
    case LiftedKind::kLayerNorm:
      return fmt::format("layer_norm [{}] eps={:g}", weight.dim(0), eps);
    case LiftedKind::kRmsNorm:
      return fmt::format("rms_norm [{}] eps={:g}", weight.dim(0), eps);
    case LiftedKind::kGelu:
      return fmt::format("gelu ({})", activation_name(activation));
    case LiftedKind::kOverflowClamp:
      return "fp16 overflow clamp (looked through: the plan's residual stream stays f32)";
    case LiftedKind::kAttention: {
      const LiftedAttention& a = attention;
      std::string bias_text;
      if (a.bias == PositionBias::kT5Relative)
        bias_text =
            fmt::format(", t5 relative bias ({} buckets, {}, max distance {})", a.num_buckets,
                        a.bidirectional_buckets ? "bidirectional" : "causal", a.max_distance);
      else if (a.bias == PositionBias::kAlibi)
        bias_text = ", alibi";
      return fmt::format("attention {} heads x {}{}, scale {:g}{}{}", a.num_heads, a.head_dim,
                         a.fused_qkv ? " (fused qkv)" : "", a.scale, a.causal ? ", causal" : "",
                         bias_text);
    }
  }
  return "?";
}

int LiftResult::op_computing(int value) const {
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].output == value) return static_cast<int>(i);
  return -1;
}

LiftResult lift_import_graph(const PatternGraph& g, const Logger& log) {
  check_arity(g.graph());
  Lifter l{g, log, {}};
  l.r.op_of_node.assign(g.graph().nodes().size(), -1);
  l.overflow_clamps();
  l.embeddings();
  l.linears();
  l.layer_norms();
  l.layer_norm_decompositions();
  l.rms_norms();
  l.gelus();
  l.attentions();
  for (int n : g.graph().order()) {
    // (A Constant of no elements folds to no data: still a constant.)
    if (l.r.op_of_node[n] >= 0 || g.node(n).op_type == "Constant") continue;
    bool constant = true;
    for (int o : g.node(n).outputs) constant = constant && (o < 0 || g.constant(o));
    if (!constant) l.r.generic_nodes.push_back(n);
  }
  std::map<std::string, int> counts;
  for (const LiftedOp& op : l.r.ops) ++counts[std::string(lifted_kind_name(op.kind))];
  std::string text;
  for (const auto& [kind, count] : counts)
    text += fmt::format("{}{}x{}", text.empty() ? "" : " ", kind, count);
  log.info("{}: lifted {} ops ({}); {} nodes stay generic", g.graph().path(), l.r.ops.size(),
           text.empty() ? "none" : text, l.r.generic_nodes.size());
  return std::move(l.r);
}

}  // namespace kiln
