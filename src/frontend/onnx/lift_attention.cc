// The attention lift. From one Softmax: back through the additive terms and constant factors to
// the score MatMul, from its operands back through reshapes, transposes, constant factors and
// BLOOM's QKV split to the projections' outputs; forward to the context MatMul, its value
// operand back the same way, and on to the output projection's input. The heads and head size
// come from the probe shapes, the scale from the constant factors, and the position bias and
// masking from the additive terms themselves: they are computed on probe data (the projections
// bound to zeros, the attention mask all ones) and compared with what kiln's Attention adds —
// BLOOM's ALiBi slopes times key positions, T5's relative-position buckets looked up in the
// graph's table — and with a causal or a full mask.
#include <cmath>

#include "frontend/onnx/lift_ops.h"
#include "graph/position_bias.h"

namespace kiln {
namespace {

struct Walk {
  int source = -1;  // the projection output (a lifted linear's) or graph input reached
  int split = -1;   // the QKV split index passed (Gather on a [.., heads, 3, head_dim] reshape)
  double factor = 1.0;
  std::string problem;
};

bool is_layout(std::string_view op) {
  return op == "Reshape" || op == "Transpose" || op == "Squeeze" || op == "Unsqueeze";
}

// Back from an operand of the score or context MatMul to the projection it reads.
Walk walk_to_projection(const PatternGraph& g, const LiftResult& lifted, int v) {
  Walk w;
  for (int guard = 0; guard < 64; ++guard) {
    v = g.through_casts(v);
    if (lifted.op_computing(v) >= 0 || g.graph().values()[v].kind == ImportValueKind::kInput) {
      w.source = v;
      return w;
    }
    const int n = g.producer(v);
    if (n < 0) {
      w.problem =
          fmt::format("'{}' is neither a projection's output nor a graph input", g.value_name(v));
      return w;
    }
    const ImportNode& node = g.node(n);
    if (is_layout(node.op_type)) {
      v = node.inputs[0];
    } else if ((node.op_type == "Mul" || node.op_type == "Div") && g.non_constant_input(n) >= 0 &&
               g.scalar(node.inputs[1 - g.non_constant_input(n)])) {
      const int in = g.non_constant_input(n);
      const double c = *g.scalar(node.inputs[1 - in]);
      if (node.op_type == "Div" && in != 0) {
        w.problem = fmt::format("node '{}' divides a constant by the activations", node.name);
        return w;
      }
      w.factor *= node.op_type == "Mul" ? c : 1.0 / c;
      v = node.inputs[in];
    } else if ((node.op_type == "Gather" || node.op_type == "Slice") && w.split < 0) {
      // BLOOM's fused_qkv.view(b, s, heads, 3, head_dim)[..., i, :]: a Gather of index i on
      // axis 3 (TorchScript), or a Slice [i, i + 1) on axis 3 before a Squeeze.
      int64_t axis = 0, index = -1;
      if (node.op_type == "Gather") {
        const OnnxAttribute* a = node.find_attribute("axis");
        axis = a ? a->i : 0;
        if (const std::optional<double> i = g.scalar(node.inputs[1])) index = std::llround(*i);
      } else if (node.inputs.size() >= 4 && node.inputs[3] >= 0) {
        const std::optional<double> start = g.scalar(node.inputs[1]),
                                    end = g.scalar(node.inputs[2]), ax = g.scalar(node.inputs[3]);
        const std::optional<double> step =
            node.inputs.size() > 4 && node.inputs[4] >= 0 ? g.scalar(node.inputs[4]) : 1.0;
        if (start && end && ax && step == 1.0 && *end == *start + 1) {
          axis = std::llround(*ax);
          index = std::llround(*start);
        }
      }
      const std::optional<Shape> shape = g.probe_shape(node.inputs[0]);
      if (index < 0 || index > 2 || !shape || shape->size() != 5 || (axis != 3 && axis != -2) ||
          (*shape)[3] != 3) {
        w.problem = fmt::format(
            "node '{}' ({}) is not a split of a fused QKV projection in BLOOM's layout "
            "[batch, seq, heads, 3, head_dim]",
            node.name, node.op_type);
        return w;
      }
      w.split = static_cast<int>(index);
      v = node.inputs[0];
    } else {
      w.problem = fmt::format(
          "node '{}' ({}) between the projection and the scores is not a "
          "reshape, transpose, constant factor or QKV split",
          node.name, node.op_type);
      return w;
    }
  }
  w.problem = "the path from the projection is too long";
  return w;
}

bool near(double a, double b, double tol) { return std::fabs(a - b) <= tol * (1.0 + std::fabs(b)); }

}  // namespace

bool lift_attention(const PatternGraph& g, const LiftResult& lifted, int softmax, LiftedOp* op,
                    PatternFailure* failure) {
  const ImportNode& sm = g.node(softmax);
  failure->pattern = "attention";
  failure->node = sm.name;
  auto fail = [&](std::string reason) {
    failure->reason = std::move(reason);
    return false;
  };
  const OnnxAttribute* axis = sm.find_attribute("axis");
  const std::optional<Shape> sm_shape = g.probe_shape(sm.inputs[0]);
  if (!sm_shape || sm_shape->size() < 3) return fail("the scores' shape is not known");
  if (axis && axis->i != -1 && axis->i != static_cast<int64_t>(sm_shape->size()) - 1)
    return fail("softmax is not over the last axis (the keys)");

  // Scores: back to the MatMul through additive terms, constant factors and reshapes.
  double scale = 1.0;
  int v = sm.inputs[0];
  int score_mm = -1;
  for (int guard = 0; guard < 32 && score_mm < 0; ++guard) {
    const int n = g.producer(v);
    if (n < 0) return fail("no MatMul computes the scores");
    const ImportNode& node = g.node(n);
    if (node.op_type == "MatMul" && lifted.op_of_node[n] < 0) {
      score_mm = n;
    } else if (is_layout(node.op_type)) {
      v = node.inputs[0];
    } else if (node.op_type == "Add") {
      // The scores are the term that a MatMul of activations computes; the other is added.
      int scores_in = -1;
      for (int i = 0; i < 2; ++i) {
        for (int u : g.upstream_nodes(node.inputs[i]))
          if (g.node(u).op_type == "MatMul" && lifted.op_of_node[u] < 0) scores_in = i;
      }
      if (scores_in < 0)
        return fail(fmt::format("node '{}' adds two terms without scores", node.name));
      v = node.inputs[scores_in];
    } else if (node.op_type == "Where" && node.inputs.size() == 3) {
      // A mask written as Where(keep, scores, fill): the fill is a constant, the scores the
      // other branch (the mask itself is compared below with the added terms).
      const bool first = g.scalar(node.inputs[1]).has_value();
      const bool second = g.scalar(node.inputs[2]).has_value();
      if (first == second)
        return fail(fmt::format(
            "node '{}' (Where) does not choose between the scores and a constant", node.name));
      v = node.inputs[second ? 1 : 2];
    } else if ((node.op_type == "Mul" || node.op_type == "Div") && g.non_constant_input(n) >= 0 &&
               g.scalar(node.inputs[1 - g.non_constant_input(n)])) {
      const int in = g.non_constant_input(n);
      // A factor between an addition and the softmax scales the added terms too; they are
      // compared below as the softmax sees them, so only the scores' factor is kept here.
      const double c = *g.scalar(node.inputs[1 - in]);
      scale *= node.op_type == "Mul" ? c : 1.0 / c;
      v = node.inputs[in];
    } else {
      return fail(
          fmt::format("node '{}' ({}) between the scores and the softmax is not an "
                      "addition, mask, constant factor or reshape",
                      node.name, node.op_type));
    }
  }
  if (score_mm < 0) return fail("no MatMul computes the scores");
  const Walk q = walk_to_projection(g, lifted, g.node(score_mm).inputs[0]);
  const Walk k = walk_to_projection(g, lifted, g.node(score_mm).inputs[1]);
  if (!q.problem.empty()) return fail("query: " + q.problem);
  if (!k.problem.empty()) return fail("key: " + k.problem);

  // Context: the probabilities times the values.
  int p = sm.outputs[0];
  int ctx_mm = -1;
  for (int guard = 0; guard < 8 && ctx_mm < 0; ++guard) {
    const std::vector<int> users = g.data_users(p);
    if (users.size() != 1) return fail("the probabilities are read more than once");
    const ImportNode& next = g.node(users[0]);
    if (next.op_type == "MatMul" && next.inputs[0] == p) {
      ctx_mm = users[0];
    } else if (next.op_type == "Cast" || next.op_type == "Identity" || is_layout(next.op_type)) {
      p = next.outputs[0];
    } else {
      return fail(
          fmt::format("the probabilities go to node '{}' ({}), not a MatMul with the "
                      "values",
                      next.name, next.op_type));
    }
  }
  if (ctx_mm < 0) return fail("no MatMul of the probabilities with the values");
  const Walk val = walk_to_projection(g, lifted, g.node(ctx_mm).inputs[1]);
  if (!val.problem.empty()) return fail("value: " + val.problem);
  if (val.factor != 1.0) return fail("the values are scaled");
  scale *= q.factor * k.factor;

  // Output: through reshapes and transposes to the output projection's input.
  int out = g.node(ctx_mm).outputs[0];
  for (int guard = 0; guard < 8; ++guard) {
    const std::vector<int> users = g.data_users(out);
    if (users.size() != 1) break;
    const ImportNode& next = g.node(users[0]);
    if (!is_layout(next.op_type) && next.op_type != "Cast" && next.op_type != "Identity") break;
    out = next.outputs[0];
  }
  const std::optional<Shape> out_shape = g.probe_shape(out);
  const std::optional<Shape> v_shape = g.probe_shape(g.node(ctx_mm).inputs[1]);
  const std::optional<Shape> q_shape = g.probe_shape(q.source);
  if (!out_shape || !v_shape || !q_shape) return fail("the shapes around it are not known");

  LiftedAttention a;
  a.q = q.source;
  a.k = k.source;
  a.v = val.source;
  a.head_dim = static_cast<int>(v_shape->back());
  const int64_t out_width = out_shape->back();
  if (a.head_dim <= 0 || out_width % a.head_dim != 0)
    return fail(fmt::format("the output width {} is not a multiple of the head size {}", out_width,
                            a.head_dim));
  a.num_heads = static_cast<int>(out_width / a.head_dim);
  a.fused_qkv = q.source == k.source && k.source == val.source;
  if (a.fused_qkv) {
    if (q.split != 0 || k.split != 1 || val.split != 2)
      return fail(fmt::format("the fused projection is split as q={} k={} v={}, not 0, 1, 2",
                              q.split, k.split, val.split));
    if (q_shape->back() != 3 * out_width)
      return fail(
          fmt::format("the fused projection is {} wide, not 3 x {}", q_shape->back(), out_width));
  } else if (q.split >= 0 || k.split >= 0 || val.split >= 0) {
    return fail("q, k and v are split from different projections");
  } else if (q_shape->back() != out_width) {
    return fail(
        fmt::format("the query projection is {} wide, the output {}", q_shape->back(), out_width));
  }
  a.scale = static_cast<float>(scale);

  // The additive terms on probe data: scores zero (projections bound to zeros), no padding.
  std::map<int, ImportTensor> zeros;
  for (int s : {a.q, a.k, a.v}) {
    const std::optional<Shape> shape = g.probe_shape(s);
    if (!shape) return fail(fmt::format("the shape of '{}' is not known", g.value_name(s)));
    if (!zeros.count(s)) zeros[s] = ImportTensor::zeros(g.probe_type(s), *shape);
  }
  std::vector<float> bias;
  try {
    bias = g.evaluate(sm.inputs[0], zeros).to_floats();
  } catch (const Error& e) {
    return fail(std::string("its position bias and mask could not be computed: ") + e.what());
  }
  const int64_t sq = (*sm_shape)[sm_shape->size() - 2], sk = sm_shape->back();
  const int64_t total = static_cast<int64_t>(bias.size());
  const int64_t heads = a.num_heads;
  if (total % (heads * sq * sk) != 0)
    return fail(fmt::format("the scores {} do not hold {} heads", shape_str(*sm_shape), heads));
  // The first batch row's [heads, sq, sk] (every row is the same without padding).
  auto at = [&](int64_t h, int64_t i, int64_t j) { return bias[(h * sq + i) * sk + j]; };
  // Masks add the type's lowest value (HF today) or -10000 (older exports); position biases
  // stay far above either.
  constexpr float kMasked = -5e3f;
  bool causal = true, full = true;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < sk; ++j) {
        const bool masked = at(h, i, j) < kMasked;
        // Causal: key j visible to query i when j <= i (+ sk - sq for keys before the queries).
        const bool visible = j <= i + (sk - sq);
        if (masked == visible) causal = false;
        if (masked) full = false;
      }
  if (!causal && !full) return fail("its mask is neither causal nor full (beyond padding)");
  a.causal = causal && !full;
  a.padding_mask = false;
  for (const char* name : {"attention_mask", "encoder_attention_mask"})
    a.padding_mask = a.padding_mask || g.depends_on_input(sm.inputs[0], name);

  // Which position bias: none, ALiBi, or T5's table.
  auto visible = [&](int64_t i, int64_t j) { return !a.causal || j <= i + (sk - sq); };
  bool zero = true;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < sk; ++j)
        if (visible(i, j) && at(h, i, j) != 0.0f) zero = false;
  int table_node = -1;
  const std::vector<int> upstream = g.upstream_nodes(sm.inputs[0]);
  for (int u : upstream) {
    const ImportNode& node = g.node(u);
    if (node.op_type == "Gather") {
      const ImportTensor* t = g.constant(node.inputs[0]);
      if (t && t->rank() == 2 && t->dim(1) == heads && is_float_type(t->type())) table_node = u;
    }
  }
  if (zero) {
    a.bias = PositionBias::kNone;
  } else if (table_node >= 0) {
    const ImportNode& gather = g.node(table_node);
    const std::vector<float> table = g.constant(gather.inputs[0])->to_floats();
    a.bias = PositionBias::kT5Relative;
    a.bias_table = g.through_casts(gather.inputs[0]);
    a.num_buckets = static_cast<int>(g.constant(gather.inputs[0])->dim(0));
    a.bidirectional_buckets = !a.causal;
    // max_distance from log(relative / max_exact) / log(max_distance / max_exact).
    const int max_exact = (a.bidirectional_buckets ? a.num_buckets / 2 : a.num_buckets) / 2;
    for (int u : upstream) {
      const ImportNode& node = g.node(u);
      if (node.op_type != "Div" || g.producer_if(node.inputs[0], "Log") < 0) continue;
      if (const std::optional<double> c = g.scalar(node.inputs[1]))
        a.max_distance = static_cast<int>(std::lround(max_exact * std::exp(*c)));
    }
    if (a.max_distance <= 0) return fail("no log(distance) / log(max_distance / max_exact) found");
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t j = 0; j < sk; ++j) {
          if (!visible(i, j)) continue;
          const int b = t5_relative_bucket(j - (i + sk - sq), a.bidirectional_buckets,
                                           a.num_buckets, a.max_distance);
          if (!near(at(h, i, j), table[b * heads + h], 1e-6))
            return fail(fmt::format(
                "its relative-position bias at head {}, query {}, key {} is {}, not T5's "
                "bucket {} of '{}' ({})",
                h, i, j, at(h, i, j), b, gather.name, table[b * heads + h]));
        }
  } else {
    // Whatever computes the key positions (BLOOM: cumsum(mask) - 1), the added term must be
    // ALiBi's: per head, slope times key position, rows differing by a constant.
    a.bias = PositionBias::kAlibi;
    a.slopes = alibi_slopes(a.num_heads);
    // A half graph holds the slopes rounded to its type (HF builds the ALiBi tensor in float,
    // then casts it to the model's dtype) and rounds slope x position once more: 2^-9 relative
    // covers both in fp16. Only the slopes of power-of-two head counts are exact there.
    bool half = false;
    for (int u : upstream)
      for (int o : g.node(u).outputs) half = half || (o >= 0 && is_half_type(g.probe_type(o)));
    const double tolerance = half ? 1.0 / 512 : 1e-5;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t j = 0; j < sk; ++j) {
          if (!visible(i, j)) continue;
          const double want = double(a.slopes[h]) * double(j);
          if (!near(at(h, i, j) - at(h, i, 0), want, tolerance))
            return fail(
                fmt::format("its position bias at head {}, query {}, key {} is {}, not "
                            "ALiBi's {} (slope {})",
                            h, i, j, at(h, i, j) - at(h, i, 0), want, a.slopes[h]));
        }
  }

  *op = LiftedOp{LiftedKind::kAttention, sm.name, a.q, out, {}};
  op->attention = a;
  std::vector<int> stops{a.q, a.k, a.v};
  for (const LiftedOp& other : lifted.ops) stops.push_back(other.output);
  op->nodes = g.nodes_between(out, stops);
  return true;
}

}  // namespace kiln
