// Tactic selection at build time (`kiln build --device cuda`, like TensorRT's): every Linear of a
// graph gets, per row count the plan's profile can run, the kernel and cuBLASLt algorithm that
// was fastest when timed on this GPU on the node's own weights. Linears of one signature (shape,
// dtypes, bias, activation, residual, TF32) share one timing. The plan stores the choices and
// the build log prints them. Row counts are the output's (a Linear of gathered rows,
// fuse_gather_linear, has as many rows as it gathers, not as its input has).
#include <algorithm>
#include <map>

#include "backend/cuda/cuda_kernels.h"

namespace kiln::cuda {

namespace {

// Row counts a Linear over `symbol` rows meets: decode's few rows (where GEMV competes with
// cuBLASLt; 3 and 5 too, where the GEMV at 8 warps an SM measured faster in real steps than the
// choice timed at 4 and 8 rows), the skinny GEMM's most (kSkinnyMaxRows: a step of 17-32 rows
// would otherwise take the 64-row bucket's tactic, cuBLASLt) and each workspace bucket's bound.
std::vector<int64_t> tactic_rows(const std::string& symbol, const ShapeProfile& profile) {
  std::vector<int64_t> rows = {1, 2, 3, 4, 5, 8, kSkinnyMaxRows};
  for (int64_t bucket : profile.token_buckets) {
    const auto bound = profile.bucket_bindings(bucket);
    const auto it = bound.find(symbol);
    if (it != bound.end()) rows.push_back(it->second);
  }
  const auto bound = profile.bucket_bindings(profile.token_buckets.back());
  const auto cap = bound.find(symbol);
  if (cap != bound.end()) std::erase_if(rows, [&](int64_t r) { return r > cap->second; });
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

std::string describe(const LinearTactic& t) {
  return fmt::format("{}: {} {:.1f} us", t.rows, t.kernel, t.us);
}

}  // namespace

const LinearTactic* tactic_for_rows(std::span<const LinearTactic> tactics, int64_t n,
                                    bool inexact) {
  for (const LinearTactic& t : tactics)
    if (t.rows >= n) return t.rows == n || n <= kTacticNearestRows || inexact ? &t : nullptr;
  return inexact && !tactics.empty() ? &tactics.back() : nullptr;
}

void select_linear_tactics(Graph& graph, const ShapeProfile& profile, CudaContext& ctx) {
  std::map<std::string, std::vector<int>> groups;  // signature -> nodes
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& n = graph.nodes[i];
    if (n.op != OpKind::kLinear) continue;
    const LinearDesc d = describe_linear(n);
    const Value& x = graph.values[d.operand(LinearOperand::kX)];
    const Value& y = graph.values[n.outputs[0]];
    const Value& w = graph.values[d.operand(LinearOperand::kWeight)];
    const bool bias = d.has(LinearOperand::kBias);
    const Value* b = bias ? &graph.values[d.operand(LinearOperand::kBias)] : nullptr;
    if (w.kind != ValueKind::kWeight || (bias && b->kind != ValueKind::kWeight)) continue;
    // Quantized weights (int8, int4, fp8): the kernel picks its path by row count
    // (cuda_linear_i8.cc, cuda_linear_w8a8.cc), nothing to time.
    if (w.dtype == DType::kI8 || w.dtype == DType::kI4 || w.dtype == DType::kF8E4M3) continue;
    if (y.shape.empty() || !y.shape[0].is_symbolic()) continue;
    const LinearEpilogue& e = d.epilogue;
    const std::string key = fmt::format(
        "[{}] -> [{}] {}{}{}{}{}{}{}{}{} over {}", sym_shape_str(x.shape), w.shape[0].value,
        dtype_name(w.dtype), bias ? fmt::format(", {} bias", dtype_name(b->dtype)) : "",
        e.activation ? fmt::format(", {}", activation_name(*e.activation)) : "",
        d.has(LinearOperand::kResidual) ? ", residual" : "",
        e.norm ? fmt::format(", folded {}", input_norm_name(*e.norm)) : "",
        d.has(LinearOperand::kNormScale) ? ", norm scale" : "",
        d.has(LinearOperand::kRows) ? ", gathered rows" : "", e.widen ? ", f32 output" : "",
        n.attr<LinearAttrs>().tf32 ? ", tf32" : "", y.shape[0].symbol);
    groups[key].push_back(static_cast<int>(i));
  }
  for (const auto& [key, nodes] : groups) {
    const Node& first = graph.nodes[nodes.front()];
    const std::vector<int64_t> rows =
        tactic_rows(graph.values[first.outputs[0]].shape[0].symbol, profile);
    const std::vector<LinearTactic> tactics = time_linear_tactics(graph, first, ctx, rows);
    std::string chosen;
    for (const LinearTactic& t : tactics) chosen += (chosen.empty() ? "" : ", ") + describe(t);
    ctx.host().log().info("tactics for {} linear{} {}: rows {}", nodes.size(),
                          nodes.size() == 1 ? "" : "s", key, chosen);
    for (int i : nodes) graph.nodes[i].attr<LinearAttrs>().tactics = tactics;
  }
}

}  // namespace kiln::cuda
